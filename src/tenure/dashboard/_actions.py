"""The actions: revoke one lease with the token the operator saw, bulk revoke
a filtered set after a dry run, and cancel the run of a thread the operator saw.
Each needs a writable dashboard, a request from its own pages (CSRF token, same
origin), and is written to the audit log."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .._errors import InvalidArgument
from .._validate import check_name
from ..runtime._identity import run_of
from ._context import Context, Refused, parse_token, who
from ._security import Csrf
from ._watcher import LeaseFilter, LeaseRow

__all__ = ["BULK_MOST", "Actions"]

#: A bulk action acts on at most this many leases (the dry run says when more match).
BULK_MOST = 500
#: The largest form an action takes (a bulk revoke of BULK_MOST long keys fits).
_FORM_MOST = 4 << 20


class Actions:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def confirm_revoke(self, request: Request) -> Response:
        """The confirmation: names the holder, or says the lease changed since it was seen."""
        key = check_name(request.query_params.get("k", ""), "key")
        token = parse_token(request.query_params.get("token", ""))
        record = await self.ctx.backend.get_lease(key)
        return self.ctx.page(
            request, "confirm.html", view="confirm", key=key, token=token, record=record
        )

    async def revoke(self, request: Request) -> Response:
        form = await self._acting(request)
        key = check_name(form.get("k", ""), "key")
        token = parse_token(form.get("token", ""))
        revoked = await self._revoke(request, key, token, form.get("owner", ""))
        done = "revoked" if revoked else "unchanged"
        return RedirectResponse(f"/key?{urlencode({'k': key, 'done': done})}", status_code=303)

    async def bulk_dry_run(self, request: Request) -> Response:
        """Exactly the leases a bulk revoke of the page's filter would revoke, read now."""
        ctx = self.ctx
        chosen = ctx.lease_filter(request)
        await ctx.watcher.ready_for_a_page()
        found: list[LeaseRow] = []
        more = 0
        root = ctx.settings.prefix
        async for key, record in ctx.backend.scan_leases(
            chosen.prefix if chosen.prefix.startswith(root) else root
        ):
            row = ctx.watcher.row(key)
            if row is None or row.token != record.token:
                row = LeaseRow(key, record.owner, record.token, record.ttl_ms, "ok")
            if not chosen.matches(row):
                continue
            if len(found) < BULK_MOST:
                found.append(row)
            else:
                more += 1
        return ctx.page(request, "bulk.html", view="bulk", filter=chosen, rows=found, more=more)

    async def bulk_revoke(self, request: Request) -> Response:
        form = await self._acting(request)
        chosen = LeaseFilter(
            form.get("prefix", ""), form.get("owner_filter", ""), form.get("state", "")
        )
        keys, tokens, owners = form.getlist("k"), form.getlist("token"), form.getlist("owner")
        if not len(keys) == len(tokens) == len(owners) or len(keys) > BULK_MOST:
            raise InvalidArgument("the bulk revoke's list of leases is malformed")
        done = []
        for key, token, owner in zip(keys, tokens, owners, strict=True):
            checked_key, checked_token = check_name(key, "key"), parse_token(token)
            revoked = await self._revoke(request, checked_key, checked_token, owner, chosen)
            done.append((checked_key, owner, checked_token, revoked))
        count = sum(outcome for *_, outcome in done)
        return self.ctx.page(
            request, "bulk_done.html", view="bulk", filter=chosen, done=done, revoked=count
        )

    async def confirm_cancel(self, request: Request) -> Response:
        """The confirmation: names the run and its holder, or says the run changed since."""
        names, thread_key = self.ctx.thread_of(
            request.query_params.get("ns", ""), request.query_params.get("t", "")
        )
        run_id = check_name(request.query_params.get("run", ""), "run")
        token = parse_token(request.query_params.get("token", ""))
        record = await self.ctx.backend.get_lease(names.name(thread_key))
        return self.ctx.page(
            request,
            "confirm_cancel.html",
            view="cancel",
            namespace=names.namespace,
            thread_key=thread_key,
            run_id=run_id,
            token=token,
            record=record,
            current_run=run_of(record.owner) if record is not None else None,
        )

    async def cancel(self, request: Request) -> Response:
        """Cancel run ``run`` of the thread, only while that run (with ``token``) holds it.

        The runtime's own cancel names the run too, so a run that started after
        this check is never stopped by it either.
        """
        form = await self._acting(request)
        names, thread_key = self.ctx.thread_of(form.get("ns"), form.get("t"))
        run_id = check_name(form.get("run", ""), "run")
        token = parse_token(form.get("token", ""))
        record = await self.ctx.backend.get_lease(names.name(thread_key))
        if record is None or record.token != token or run_of(record.owner) != run_id:
            outcome = f"unchanged: run {run_id} no longer holds the thread"
        else:
            await self.ctx.runtime_of(names.namespace).cancel(thread_key, run_id=run_id)
            outcome = f"asked run {run_id} to stop"
        self.ctx.audit.write(
            who=who(request),
            client=request.client.host if request.client else None,
            action="cancel",
            key=names.name(thread_key),
            namespace=names.namespace,
            thread=thread_key,
            run_id=run_id,
            token=token,
            owner=form.get("owner", ""),
            outcome=outcome,
        )
        done = "unchanged" if outcome.startswith("unchanged") else "asked"
        query = {"ns": names.namespace, "t": thread_key, "run": run_id, "done": done}
        return RedirectResponse(f"/thread?{urlencode(query)}", status_code=303)

    async def _revoke(
        self, request: Request, key: str, token: int, owner: str, chosen: LeaseFilter | None = None
    ) -> bool:
        """``revoke_lease(key, token)``, audited; nothing happens if the token changed."""
        revoked = bool(await self.ctx.backend.revoke_lease(key, token))
        entry: dict[str, Any] = {
            "who": who(request),
            "client": request.client.host if request.client else None,
            "action": "revoke",
            "key": key,
            "token": token,
            "owner": owner,
            "outcome": "revoked" if revoked else "unchanged: the lease no longer carries the token",
        }
        if chosen is not None:
            entry["filter"] = chosen.query(page=1)
        self.ctx.audit.write(**entry)
        if revoked:
            self.ctx.watcher.revoked(key, token, f"revoked by {entry['who']} (token {token})")
        return revoked

    async def _acting(self, request: Request) -> Form:
        """The action's form, once the dashboard may act and the CSRF token is right."""
        if self.ctx.settings.read_only:
            raise Refused(403, "this dashboard is read-only")
        origin = request.headers.get("origin")
        if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
            raise Refused(403, "refused: the request comes from another site")
        form = await read_form(request)
        if not self.ctx.csrf.check(request.cookies.get(Csrf.COOKIE), form.get(Csrf.FIELD)):
            raise Refused(403, "refused: missing or wrong CSRF token (reload the page and retry)")
        return form


class Form:
    """An action's urlencoded form (parsed here: no multipart parser needed)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._pairs = pairs

    def get(self, name: str, default: str = "") -> str:
        return next((value for field, value in self._pairs if field == name), default)

    def getlist(self, name: str) -> list[str]:
        return [value for field, value in self._pairs if field == name]


async def read_form(request: Request) -> Form:
    kind = request.headers.get("content-type", "").partition(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        raise Refused(415, "an action takes a form (application/x-www-form-urlencoded)")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _FORM_MOST:
            raise Refused(413, "the form is too large")
    try:
        return Form(parse_qsl(body.decode(), keep_blank_values=True))
    except UnicodeDecodeError:
        raise InvalidArgument("the form is not UTF-8") from None
