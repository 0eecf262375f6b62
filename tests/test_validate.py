from __future__ import annotations

import enum
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenure import InvalidArgument, MemoryPubSub, SqlitePubSub, ThreadRun, ThreadRuntime
from tenure._pubsub import check_data
from tenure._validate import (
    KNOWN_NAMES,
    MAX_TTL_MS,
    check_count,
    check_keys,
    check_name,
    check_prefix,
    check_text,
    check_time,
    check_timeout,
    check_ttl,
)


@given(st.text(min_size=1).filter(lambda s: len(s.encode("utf-8", "surrogatepass")) <= 1024))
def test_any_encodable_text_up_to_1024_bytes_is_a_valid_name(name: str) -> None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(InvalidArgument, match="lone surrogate"):
            check_name(name, "key")
    else:
        assert check_name(name, "key") is name


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "key must be a str, got NoneType"),
        (b"k", "key must be a str, got bytes"),
        (1, "key must be a str, got int"),
        ("", "key must not be empty"),
        ("a" * 1025, "key must be at most 1024 bytes in UTF-8, got 1025"),
        ("€" * 342, "key must be at most 1024 bytes in UTF-8, got 1026"),
        ("\udcff", "key must be encodable as UTF-8 (it contains a lone surrogate)"),
    ],
)
def test_bad_names_have_exact_messages(value: object, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_name(value, "key")
    assert str(info.value) == message


def test_nul_and_boundaries_are_valid() -> None:
    assert check_name("\0", "owner") == "\0"
    assert check_name("a" * 1024, "owner") == "a" * 1024
    assert check_name("€" * 341 + "a", "owner")  # 1024 bytes


class Millis(enum.IntEnum):
    LEAST = 1
    SECOND = 1000
    MOST = MAX_TTL_MS


# An int subclass takes the slow path: its boundaries are checked there too.
@pytest.mark.parametrize("value", [1, 1000, MAX_TTL_MS, Millis.LEAST, Millis.SECOND, Millis.MOST])
def test_good_ttls(value: int) -> None:
    assert check_ttl(value) == value
    assert type(check_ttl(value)) is int


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "ttl_ms must be between 1 and 2147483647 milliseconds, got 0"),
        (-1, "ttl_ms must be between 1 and 2147483647 milliseconds, got -1"),
        (2**31, "ttl_ms must be between 1 and 2147483647 milliseconds, got 2147483648"),
        (True, "ttl_ms must be an int (milliseconds), got bool"),
        (1.0, "ttl_ms must be an int (milliseconds), got float"),
        ("5", "ttl_ms must be an int (milliseconds), got str"),
    ],
)
def test_bad_ttls_have_exact_messages(value: object, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_ttl(value)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-0.1, "timeout must be a finite number of seconds >= 0, got -0.1"),
        (float("nan"), "timeout must be a finite number of seconds >= 0, got nan"),
        (float("inf"), "timeout must be a finite number of seconds >= 0, got inf"),
        (True, "timeout must be a number of seconds, got bool"),
        ("1", "timeout must be a number of seconds, got str"),
        (None, "timeout must be a number of seconds, got NoneType"),
    ],
)
def test_bad_timeouts_have_exact_messages(value: object, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_timeout(value)
    assert str(info.value) == message


def test_counts_prefixes_and_key_lists() -> None:
    assert check_count(None, "limit") is None
    assert check_count(1, "limit") == 1
    assert type(check_count(Millis.LEAST, "limit")) is int
    for bad, message in [
        (0, "limit must be None or an int >= 1, got 0"),
        (-5, "limit must be None or an int >= 1, got -5"),
        (True, "limit must be None or an int >= 1, got bool"),
        (1.0, "limit must be None or an int >= 1, got float"),
    ]:
        with pytest.raises(InvalidArgument) as info:
            check_count(bad, "limit")
        assert str(info.value) == message
    assert check_prefix("") == ""
    assert check_prefix("a/") == "a/"
    with pytest.raises(InvalidArgument, match=r"^prefix must be a str, got bytes$"):
        check_prefix(b"")
    assert check_keys(["a", "b"]) == ["a", "b"]
    assert check_keys(()) == []
    for bad_keys, kind in [("ab", "str"), (b"ab", "bytes"), ({"a"}, "set"), (None, "NoneType")]:
        with pytest.raises(InvalidArgument) as info:
            check_keys(bad_keys)
        assert str(info.value) == f"keys must be a sequence of str, got {kind}"
    with pytest.raises(InvalidArgument, match=r"^key must not be empty$"):
        check_keys(["a", ""])


def test_good_timeouts() -> None:
    assert check_timeout(0) == 0.0
    assert check_timeout(2.5) == 2.5


class _PosesAsName:
    """Equal to, and hashed like, a valid name without being a ``str``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash(self.name)


@pytest.mark.asyncio
async def test_names_seen_before_are_still_checked_for_their_type() -> None:
    # The hot path looks a key or owner up among the names found valid before
    # (KNOWN_NAMES); something merely equal to one must still be refused.
    async with MemoryPubSub() as backend:
        assert (await backend.acquire_lease("seen", "owner", 1000)).acquired
        assert "seen" in KNOWN_NAMES and "owner" in KNOWN_NAMES
        for bad in (_PosesAsName("seen"), b"seen"):
            with pytest.raises(InvalidArgument, match="key must be a str"):
                await backend.acquire_lease(bad, "owner", 1000)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument, match="key must be a str"):
                await backend.release_lease(bad, "owner")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="owner must be a str"):
            await backend.renew_lease("seen", _PosesAsName("owner"), 1000)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="ttl_ms must be an int"):
            await backend.acquire_lease("seen", "owner", True)


@pytest.mark.asyncio
async def test_the_known_names_stay_bounded() -> None:
    async with MemoryPubSub() as backend:
        for i in range(3000):
            await backend.renew_lease(f"name-{i}", "owner", 1000)
    assert 0 < len(KNOWN_NAMES) <= 1024
    assert "name-2999" in KNOWN_NAMES


def test_event_texts_and_times() -> None:
    assert check_text("t" * 5000, "event.type") == "t" * 5000  # no length limit
    assert check_text("\0é", "event.type") == "\0é"
    for bad, message in [
        (7, "event.type must be a str, got int"),
        ("", "event.type must not be empty"),
        ("\ud800", "event.type must be encodable as UTF-8 (it contains a lone surrogate)"),
    ]:
        with pytest.raises(InvalidArgument) as info:
            check_text(bad, "event.type")
        assert str(info.value) == message
    assert check_time(0, "at") == 0.0 and type(check_time(5, "at")) is float
    assert check_time(-691200.5, "at") == -691200.5
    for bad, message in [
        (math.nan, "at must be a finite number of seconds, got nan"),
        (-math.inf, "at must be a finite number of seconds, got -inf"),
        (10**400, "at must be a finite number of seconds, got " + str(10**400)),
        (True, "at must be a number of seconds, got bool"),
        ("1", "at must be a number of seconds, got str"),
    ]:
        with pytest.raises(InvalidArgument) as info:
            check_time(bad, "at")
        assert str(info.value) == message


def test_event_data() -> None:
    check_data({"a": [1, "é", None, math.nan]}, "event.data")
    with pytest.raises(InvalidArgument, match=r"^event.data must be encodable as UTF-8"):
        check_data(["ok", {"x": "\udcff"}], "event.data")
    with pytest.raises(InvalidArgument, match=r"^payload must be JSON-serialisable"):
        check_data({1, 2}, "payload")


@pytest.mark.asyncio
async def test_a_signal_payload_that_cannot_be_stored_is_refused_before_any_io(
    tmp_path: Path,
) -> None:
    async def handler(run: ThreadRun) -> None:
        pass

    async with SqlitePubSub(tmp_path / "t.db") as backend:
        runtime = ThreadRuntime(backend, handler)
        try:
            for payload, why in [("a\ud800", "encodable as UTF-8"), ({1}, "JSON-serialisable")]:
                with pytest.raises(InvalidArgument, match=f"^payload must be {why}"):
                    await runtime.send_signal("thread", payload)
        finally:
            await runtime.aclose()
