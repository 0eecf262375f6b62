"""What ``tenure doctor`` checks on an etcd cluster (see :mod:`tenure._doctor`).

It reads the cluster's status, members and alarms through the backend's own
channel and writes nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from ..._doctor import Finding, ok, unsafe, warn
from ._connection import EtcdChannel, rpc

__all__ = ["diagnose"]


async def diagnose(link: EtcdChannel, call: Callable[..., Awaitable[Any]]) -> list[Finding]:
    """The findings for the cluster behind ``link``; ``call(op, method, request)``
    sends one request (errors translated)."""
    maintenance = link.stub(rpc.MaintenanceStub)
    cluster = link.stub(rpc.ClusterStub)
    status = await call("tenure doctor", maintenance.Status, rpc.StatusRequest())
    members = await call("tenure doctor", cluster.MemberList, rpc.MemberListRequest())
    alarms = await call(
        "tenure doctor",
        maintenance.Alarm,
        rpc.AlarmRequest(action=rpc.AlarmRequest.AlarmAction.GET),
    )
    findings = [
        ok(
            "server",
            f"etcd {status.version} at {link.where}, raft term {status.raftTerm}, "
            f"database {status.dbSize // 1024} KiB",
        )
    ]
    if status.leader == 0:
        findings.append(
            unsafe("leader", "the member that answered knows no leader", "check the cluster")
        )
    findings.append(_members(members.members))
    endpoints = _endpoints(link, members.members)
    if endpoints is not None:
        findings.append(endpoints)
    findings.append(_alarms(alarms.alarms))
    findings.append(
        ok(
            "clock",
            "lease deadlines use the clients' wall clocks: keep every client in NTP sync",
        )
    )
    return findings


def _members(members: Any) -> Finding:
    voters = [m for m in members if not m.isLearner]
    if len(voters) < 3:
        return warn(
            "members",
            f"{len(voters)} voting member(s): losing one stops every lease operation",
            "run 3 or 5 members",
        )
    if len(voters) % 2 == 0:
        return warn(
            "members",
            f"{len(voters)} voting members: an even number tolerates no more failures "
            f"than {len(voters) - 1}",
            "run an odd number of members",
        )
    return ok("members", f"{len(voters)} voting members: {len(voters) // 2} may fail")


def _endpoints(link: EtcdChannel, members: Any) -> Finding | None:
    listed: set[tuple[str, int | None]] = {(host.lower(), port) for host, port in link.endpoints}
    missing = [m for m in members if not _listed(m.clientURLs, listed)]
    if not missing:
        return None
    return warn(
        "endpoints",
        f"the URL lists {len(members) - len(missing)} of {len(members)} members: calls "
        "cannot go to the others when those listed fail",
        "list every member in the etcd:// URL",
    )


def _alarms(alarms: Any) -> Finding:
    raised = [rpc.AlarmType.Name(a.alarm) for a in alarms if a.alarm != rpc.AlarmType.NONE]
    if raised:
        return unsafe(
            "alarms",
            f"raised: {', '.join(sorted(set(raised)))} (etcd refuses writes)",
            "free space or repair the member, then etcdctl alarm disarm",
        )
    return ok("alarms", "none raised")


def _listed(urls: list[str], listed: set[tuple[str, int | None]]) -> bool:
    return any(((u.hostname or "").lower(), u.port) in listed for u in map(urlsplit, urls))
