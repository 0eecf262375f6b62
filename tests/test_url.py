from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenure import ConfigurationError, MemoryPubSub, default_url, from_url
from tenure._url import _SCHEMES
from tenure._url_options import redact, redact_url


@pytest.mark.asyncio
async def test_memory_url() -> None:
    backend = from_url("memory://")
    assert isinstance(backend, MemoryPubSub)
    async with backend:
        assert (await backend.acquire_lease("k", "o", 1000)).acquired


@pytest.mark.parametrize("url", ["memory://host", "memory:///path", "memory://?x=1"])
def test_memory_url_takes_nothing_more(url: str) -> None:
    with pytest.raises(ConfigurationError, match="memory://"):
        from_url(url)


def test_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as info:
        from_url("mongodb://localhost")
    message = str(info.value)
    assert "mongodb://" in message
    for scheme in ("memory://", "sqlite://", "redis://", "rediss://", "postgresql://"):
        assert scheme in message


def test_url_without_scheme_is_rejected_without_leaking_a_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        from_url("user:hunter2@localhost")
    assert "hunter2" not in str(info.value)


def test_non_string_url() -> None:
    with pytest.raises(ConfigurationError, match="must be a str"):
        from_url(42)  # type: ignore[arg-type]  # deliberately wrong type


def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # Make the driver unimportable for this test only, the way a missing package is.
    for name in [m for m in sys.modules if m == "redis" or m.startswith("redis.")]:
        monkeypatch.delitem(sys.modules, name)
    for name in [m for m in sys.modules if m.startswith("tenure.backends.redis")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(ConfigurationError) as info:
        from_url("redis://localhost:6379")
    assert "pip install 'tenure[redis]'" in str(info.value)


def test_missing_postgres_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "psycopg" or m.startswith("psycopg.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "tenure.backends.postgres", raising=False)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ConfigurationError) as info:
        from_url("postgresql://localhost/db")
    assert "pip install 'tenure[postgres]'" in str(info.value)


def test_default_url_honours_tenure_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENURE_URL", "memory://")
    assert default_url() == "memory://"
    assert isinstance(from_url(), MemoryPubSub)


def test_default_url_is_a_sqlite_file_in_the_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TENURE_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_url() == f"sqlite:///{tmp_path}/tenure/tenure.db?create_dirs=1"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://user:s3cret@host/0", "redis://user:***@host/0"),
        (
            "postgresql://u:p%40ss@db.example:5432/x?sslmode=require",
            "postgresql://u:***@db.example:5432/x?sslmode=require",
        ),
        ("redis://host:6379", "redis://host:6379"),
        ("postgresql://u:pw@[::1]:5432/x", "postgresql://u:***@[::1]:5432/x"),
        ("redis://h/0?password=s3cret&db=1", "redis://h/0?password=***&db=1"),
        ("rediss://h/0?ssl_password=s3cret", "rediss://h/0?ssl_password=***"),
        (
            "postgresql://h/x?sslpassword=s3cret&sslmode=require",
            "postgresql://h/x?sslpassword=***&sslmode=require",
        ),
        ("redis://:s3cret@[::1:6379/0", "<unparseable redis:// URL>"),
        ("sqlite:////tmp/x/demo.db", "sqlite:////tmp/x/demo.db"),
        ("sqlite:///rel.db?busy_timeout_ms=5", "sqlite:///rel.db?busy_timeout_ms=5"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    "text",
    [
        "host=db password=s3cret user=u",
        "host=db password='s3 cret' user=u",
        "connection failed: password=s3cret",
        "sslpassword=s3cret host=db",
    ],
)
def test_redact_hides_password_fields_of_dsns(text: str) -> None:
    assert "s3cret" not in redact(text) and "s3 cret" not in redact(text)


def test_redact_hides_given_secrets_in_every_written_form() -> None:
    assert redact("failed for p@ss and p%40ss", ["p@ss"]) == "failed for *** and ***"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis:/127.0.0.1:6379/7", "'redis:/': a redis:// URL needs two slashes"),
        ("redis:127.0.0.1:6379", "'redis:': a redis:// URL needs two slashes"),
        ("Postgresql:/h/db", "'Postgresql:/': a postgresql:// URL needs two slashes"),
        ("sqlite:/var/x.db", "(sqlite:///relative.db or sqlite:////absolute.db)"),
    ],
)
def test_a_known_scheme_with_too_few_slashes_is_named(url: str, said: str) -> None:
    with pytest.raises(ConfigurationError, match="no scheme") as caught:
        from_url("127.0.0.1:6379")
    assert "known schemes" in str(caught.value)
    with pytest.raises(ConfigurationError) as caught:
        from_url(url)
    assert said in str(caught.value)
    assert "no scheme" not in str(caught.value)


# -- no password in any error or repr, whatever the URL --------------------------

# A marker makes the generated password unlikely to occur in a message by chance
# (a one-letter password would "appear" in any text); the rest is adversarial:
# percent signs with and without valid escapes, "@", ":", "/", "#", "?", quotes.
_PASSWORDS = st.lists(
    st.sampled_from([*"aZ09%@:/#?&='\" +\\", "%zz", "%4", "%41", "é", "☃"]), max_size=10
).map(lambda parts: "Pw7" + "".join(parts))


def _urls(scheme: str, password: str) -> list[str]:
    quoted = quote(password, safe="")
    host = "127.0.0.1:1" if scheme != "redis+sentinel" else "127.0.0.1:1,127.0.0.1:2"
    path = "/svc" if scheme == "redis+sentinel" else "/db"
    return [
        f"{scheme}://user:{password}@{host}{path}",
        f"{scheme}://user:{quoted}@{host}{path}",
        f"{scheme}://:{password}@{host}{path}?prefix=x",
        f"{scheme}://{host}{path}?password={quoted}",
        f"{scheme}://{host}{path}?password={password}",
        f"{scheme}://user:{quoted}@{host}{path}?bogus=1",
        f"{scheme}://user:{password}@{host}{path}?max_ttl_ms=nope&password={quoted}",
    ]


def _dsns(password: str) -> list[str]:
    escaped = password.replace("\\", "\\\\").replace("'", "\\'")
    return [
        f"host=127.0.0.1 port=1 user=u password='{escaped}' dbname=d",
        f"host=127.0.0.1 port=1 user=u password={password} dbname=d",
        f"password='{escaped}' bogus=1",
    ]


def _texts(exc: BaseException) -> list[str]:
    texts = [str(exc), repr(exc)]
    if exc.__cause__ is not None:
        texts += [str(exc.__cause__), repr(exc.__cause__)]
    return texts


def _shown_by(build: Callable[[], object]) -> list[str]:
    """What building a backend shows: its error, or its repr (then it is closed)."""
    try:
        backend = build()
    except Exception as exc:
        return _texts(exc)
    try:
        return [repr(backend), str(backend)]
    finally:
        close = getattr(backend, "aclose", None)
        if close is not None:
            asyncio.run(close())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheme=st.sampled_from(sorted(_SCHEMES)), password=_PASSWORDS)
def test_no_error_or_repr_shows_a_password(scheme: str, password: str) -> None:
    for url in _urls(scheme, password):
        for shown in _shown_by(lambda url=url: from_url(url)):  # type: ignore[misc]  # bound per loop
            assert password not in shown, (url, shown)
            assert quote(password, safe="") not in shown, (url, shown)


@settings(max_examples=40, deadline=None)
@given(password=_PASSWORDS)
def test_no_postgres_dsn_error_or_repr_shows_a_password(password: str) -> None:
    from tenure.backends.postgres import PostgresPubSub

    for dsn in _dsns(password):
        for shown in _shown_by(lambda dsn=dsn: PostgresPubSub(dsn)):  # type: ignore[misc]  # bound per loop
            assert password not in shown, (dsn, shown)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_an_invalid_percent_escape_in_a_postgres_password_is_not_shown(scheme: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid percent-encoded token") as caught:
        from_url(f"{scheme}://app:s3cret%zz@127.0.0.1/db")
    assert "s3cret" not in str(caught.value)
