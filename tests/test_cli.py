"""``tenure demo`` and the command line.

The end-to-end tests run the real demo: real worker processes, a real SQLite
file, a real SIGKILL. The verdict's checker is tested on hand-made histories,
good and bad, so a PASS means something: each planted fault must turn it to FAIL.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import tenure
from tenure.cli import main
from tenure.demo._evidence import (
    COORDINATOR,
    count_takeovers,
    judge,
    plan,
    read_dir,
    read_new_lines,
)
from tenure.demo._run import demo_url
from tenure.demo._view import DemoState, render

from .postgres.helpers import drop_schema, new_schema
from .redis.helpers import delete_prefix

SRC = str(Path(__file__).resolve().parent.parent / "src")


def _run_cli(*args: str, tmp_path: Path, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    env["TMPDIR"] = str(tmp_path)  # the demo's evidence directory lands under tmp_path
    return subprocess.run(
        [sys.executable, "-m", "tenure", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp_path,
        check=False,
    )


# -- the demo, for real ------------------------------------------------------------


@pytest.mark.slow
def test_demo_passes_with_a_kill_on_sqlite(tmp_path: Path) -> None:
    proc = _run_cli(
        "demo",
        "--workers=3",
        "--threads=3",
        "--signals=40",
        "--send-seconds=4",
        "--ttl-ms=1500",
        "--seed=7",
        tmp_path=tmp_path,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "VERDICT: PASS" in out
    assert "[FAIL]" not in out
    assert re.search(r"SIGKILL w\d \(pid \d+\) holding thread-\d", out), out
    assert re.search(r"thread-\d+: taken over by w\d", out), out
    assert "backend: sqlite:///" in out
    # Not a terminal: plain progress lines, no live-view escape codes.
    assert "\x1b[" not in out


@pytest.mark.slow
def test_demo_passes_with_a_kill_on_redis(tmp_path: Path, redis_url: str, unique: str) -> None:
    """The run that used to lose signals on Redis: a signal that reached a session
    while it was closing stayed with that session's consumer (and its reader, whose
    cancellation redis-py sometimes dropped, could not be stopped)."""
    prefix = f"tenure-test-{unique}:"
    separator = "&" if "?" in redis_url else "?"
    try:
        proc = _run_cli(
            "demo",
            "--workers=3",
            "--signals=60",
            "--seed=2",
            f"--url={redis_url}{separator}prefix={prefix}",
            "--keep",  # the worker logs are checked below (under tmp_path, removed with it)
            tmp_path=tmp_path,
        )
    finally:
        asyncio.run(delete_prefix(redis_url, prefix))
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "VERDICT: PASS" in out
    assert "[FAIL]" not in out
    assert re.search(r"SIGKILL w\d \(pid \d+\) holding thread-\d", out), out
    assert f"prefix={prefix}" in out
    # No worker logged an unsubscribe that outlived its timeout.
    log_files = sorted(tmp_path.rglob("tenure-demo-*/w*.log"))
    assert len(log_files) == 3, log_files
    logs = "".join(p.read_text() for p in log_files)
    assert "takes longer than" not in logs, logs


@pytest.mark.slow
def test_demo_passes_with_a_kill_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    schema = new_schema()
    try:
        proc = _run_cli(
            "demo",
            "--workers=3",
            "--signals=60",
            "--seed=3",
            f"--url={postgres_url}?schema={schema}",
            tmp_path=tmp_path,
        )
    finally:
        drop_schema(postgres_url, schema)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "VERDICT: PASS" in out
    assert "[FAIL]" not in out
    assert re.search(r"SIGKILL w\d \(pid \d+\) holding thread-\d", out), out
    assert "backend: postgresql://" in out


@pytest.mark.slow
def test_demo_fails_when_the_workers_do_not_share_a_backend(tmp_path: Path) -> None:
    """Negative control: with memory:// every worker has its own leases, so the
    runs of a thread overlap and tokens restart: the verdict must say FAIL."""
    proc = _run_cli(
        "demo",
        "--url=memory://",
        "--workers=3",
        "--threads=2",
        "--signals=30",
        "--send-seconds=3",
        "--no-kill",
        "--seed=3",
        tmp_path=tmp_path,
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "VERDICT: FAIL" in out
    assert "[FAIL] tokens increasing" in out
    assert "evidence kept in" in out


# -- the command line ----------------------------------------------------------------


def test_help_through_python_dash_m(tmp_path: Path) -> None:
    proc = _run_cli("--help", tmp_path=tmp_path, timeout=60)
    assert proc.returncode == 0
    assert "demo" in proc.stdout


def test_demo_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for option in ("--workers", "--threads", "--signals", "--seed", "--url", "--ttl-ms"):
        assert option in out


def _help(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*args, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_run_help_lists_every_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    statuses = _help(["run"], capsys).split("exit status:")[1]
    codes = {line.split()[0] for line in statuses.splitlines() if line.strip()}
    assert {"2", "69", "73", "75", "126", "127"} <= codes
    assert "128+N" in statuses and "unknown scheme" in statuses


@pytest.mark.parametrize(
    ("args", "codes"),
    [
        (["threads"], {"0", "2", "69"}),
        (["watch"], {"0", "2", "69"}),
        (["doctor"], {"0", "1", "2", "69"}),
        (["leases", "list"], {"0", "2", "69"}),
        (["leases", "get"], {"0", "1", "2", "69"}),
        (["leases", "revoke"], {"0", "1", "2", "69"}),
        (["demo"], {"0", "1", "2"}),
    ],
)
def test_each_command_help_lists_its_exit_statuses(
    args: list[str], codes: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    statuses = _help(args, capsys).split("exit status:")[1]
    assert {line.split()[0] for line in statuses.splitlines() if line[:4].strip()} == codes


def test_every_command_takes_its_options_after_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only ``run`` takes a command's words; the others parse options wherever they stand."""
    url = f"sqlite:///{tmp_path / 'leases.db'}"

    async def grant() -> int | None:
        async with tenure.from_url(url) as backend:
            return (await backend.acquire_lease("job", "alice", 60_000)).token

    token = asyncio.run(grant())
    assert main(["leases", "get", "job", "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["owner"] == "alice"
    assert main(["leases", "revoke", "job", "--url", url, "--token", str(token)]) == 0
    assert main(["leases", "get", "job", "--url", url]) == 1
    assert main(["threads", "--json", "--url", url, "--namespace", "nothing.here"]) == 0


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("tenure ")


@pytest.mark.parametrize(
    "args",
    [["demo", "--workers", "0"], ["demo", "--signals", "x"], ["demo", "--ttl-ms", "5"]],
)
def test_bad_options_are_refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_unknown_scheme_stops_before_starting_workers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert main(["demo", "--url", "nope://somewhere"]) == 2
    assert "unknown URL scheme" in capsys.readouterr().out
    assert not list(tmp_path.glob("tenure-demo-*/w*.jsonl"))


# -- the verdict on hand-made evidence ---------------------------------------------


def rec(k: str, w: str, t: int, **fields: Any) -> dict[str, Any]:
    return {"k": k, "w": w, "t": t, **fields}


def good_history() -> list[dict[str, Any]]:
    """Two threads; w1 is killed while owning thread-2 and w2 takes it over."""
    return [
        rec("sent", "w1", 90, sig="s1", thread="thread-1", outcome="wake"),
        rec("run_start", "w1", 100, thread="thread-1", run_id="a.1", token=5),
        rec(
            "handled",
            "w1",
            150,
            sig="s1",
            thread="thread-1",
            run_id="a.1",
            token=5,
            start=110,
            end=150,
        ),
        rec("run_end", "w1", 200, thread="thread-1", run_id="a.1", token=5, how="ok"),
        rec("sent", "w2", 240, sig="s2", thread="thread-1", outcome="wake"),
        rec("run_start", "w2", 250, thread="thread-1", run_id="b.1", token=7),
        rec(
            "handled",
            "w2",
            300,
            sig="s2",
            thread="thread-1",
            run_id="b.1",
            token=7,
            start=260,
            end=300,
        ),
        rec("run_end", "w2", 400, thread="thread-1", run_id="b.1", token=7, how="ok"),
        rec("sent", "w1", 490, sig="s3", thread="thread-2", outcome="wake"),
        rec("run_start", "w1", 500, thread="thread-2", run_id="c.1", token=6),
        rec("killed", COORDINATOR, 600, victim="w1", pid=1),
        rec("sent", "w2", 650, sig="s4", thread="thread-2", outcome="deliver"),
        rec("run_start", "w2", 700, thread="thread-2", run_id="d.1", token=9),
        rec(
            "handled",
            "w2",
            750,
            sig="s3",
            thread="thread-2",
            run_id="d.1",
            token=9,
            start=710,
            end=750,
        ),
        rec(
            "handled",
            "w2",
            800,
            sig="s4",
            thread="thread-2",
            run_id="d.1",
            token=9,
            start=760,
            end=800,
        ),
        rec("run_end", "w2", 900, thread="thread-2", run_id="d.1", token=9, how="ok"),
    ]


def check(verdict_records: list[dict[str, Any]], name: str) -> tuple[bool, list[str]]:
    verdict = judge(verdict_records)
    found = [c for c in verdict.checks if c.name == name]
    assert len(found) == 1
    return found[0].passed, found[0].problems


def replace(history: list[dict[str, Any]], k: str, run_id: str, **fields: Any) -> None:
    for r in history:
        if r["k"] == k and r.get("run_id") == run_id:
            r.update(fields)
            return
    raise AssertionError(f"no {k} of {run_id}")


def test_good_history_passes() -> None:
    verdict = judge(good_history())
    assert verdict.passed, list(verdict.lines())
    assert verdict.figures["sent"] == 4
    assert verdict.figures["handled"] == 4
    assert verdict.figures["duplicates"] == 0
    assert verdict.figures["runs"] == 4
    assert list(verdict.lines())[-1] == "VERDICT: PASS"


def test_duplicates_are_allowed_and_counted() -> None:
    history = good_history()
    history.append(
        rec(
            "handled",
            "w2",
            850,
            sig="s3",
            thread="thread-2",
            run_id="d.1",
            token=9,
            start=810,
            end=850,
        )
    )
    verdict = judge(history)
    assert verdict.passed
    assert verdict.figures["duplicates"] == 1


def test_a_missing_signal_fails() -> None:
    history = [r for r in good_history() if not (r["k"] == "handled" and r["sig"] == "s2")]
    passed, problems = check(history, "every signal handled")
    assert not passed
    assert any("s2" in p for p in problems)
    assert not judge(history).passed


def test_a_signal_handled_on_another_thread_fails() -> None:
    history = good_history()
    for r in history:
        if r["k"] == "sent" and r["sig"] == "s1":
            r["thread"] = "thread-2"
    passed, problems = check(history, "every signal handled")
    assert not passed
    assert any("handled on thread-1" in p for p in problems)


def test_overlapping_owners_fail() -> None:
    history = good_history()
    replace(history, "run_start", "b.1", t=180)  # w2 starts before w1's run ended at 200
    passed, problems = check(history, "one owner at a time")
    assert not passed
    assert any("b.1" in p and "a.1" in p for p in problems)


def test_a_run_overlapping_a_killed_owner_fails() -> None:
    history = good_history()
    replace(history, "run_start", "d.1", t=550)  # before the kill at 600: w1 still ran
    passed, problems = check(history, "one owner at a time")
    assert not passed
    assert any("killed" in p for p in problems)


def test_work_outside_the_run_fails() -> None:
    history = good_history()
    for r in history:
        if r["k"] == "handled" and r["sig"] == "s1":
            r["end"] = 210  # after run a.1 ended
    passed, _ = check(history, "one owner at a time")
    assert not passed


@pytest.mark.parametrize("token", [5, 4])
def test_a_token_that_does_not_increase_fails(token: int) -> None:
    history = good_history()
    replace(history, "run_start", "b.1", token=token)
    passed, problems = check(history, "tokens increasing")
    assert not passed
    assert any(f"to {token}" in p for p in problems)


def test_a_run_without_token_fails() -> None:
    history = good_history()
    replace(history, "run_start", "d.1", token=None)
    passed, _ = check(history, "tokens increasing")
    assert not passed


def test_empty_evidence_fails() -> None:
    verdict = judge([])
    assert not verdict.passed
    assert all(not c.passed for c in verdict.checks)


def test_takeovers_count_only_unreleased_leases() -> None:
    ev = "event"
    history = [
        rec(ev, "w1", 1, ev="wake", thread="t"),
        rec(ev, "w1", 2, ev="release", thread="t"),
        rec(ev, "w2", 3, ev="takeover", thread="t"),  # adopted after a release: not a takeover
        rec(ev, "w3", 4, ev="wake", thread="t"),  # w2 never released: w3 took over
        rec(ev, "w3", 5, ev="lost", thread="t"),
        rec(ev, "w1", 6, ev="wake", thread="t"),
    ]
    assert count_takeovers(history) == 1


# -- evidence files, plan, URL, display ---------------------------------------------


def test_a_line_cut_by_a_kill_is_left_for_later(tmp_path: Path) -> None:
    path = tmp_path / "w1.jsonl"
    path.write_bytes(b'{"k":"hello","w":"w1","t":1}\n{"k":"sent","w":"w1"')
    records, offset = read_new_lines(path, 0)
    assert records == [{"k": "hello", "w": "w1", "t": 1}]
    with path.open("ab") as f:
        f.write(b',"t":2}\n')
    more, _ = read_new_lines(path, offset)
    assert more == [{"k": "sent", "w": "w1", "t": 2}]
    assert len(read_dir(tmp_path)) == 2


def test_plan_is_reproducible_and_reaches_every_thread_from_every_worker() -> None:
    first = plan(11, workers=3, threads=4, signals=50)
    assert first == plan(11, workers=3, threads=4, signals=50)
    assert first != plan(12, workers=3, threads=4, signals=50)
    assert len({s.sig for s in first}) == 50
    tail = first[-12:]
    assert {(s.sender, s.thread) for s in tail} == {
        (f"w{w}", f"thread-{t}") for w in range(1, 4) for t in range(1, 5)
    }


def test_demo_url_keeps_backend_defaults_and_adds_only_a_redis_prefix(tmp_path: Path) -> None:
    assert demo_url(None, tmp_path, "tag") == f"sqlite:///{tmp_path / 'demo.db'}"
    assert demo_url("sqlite:////x/y.db", tmp_path, "tag") == "sqlite:////x/y.db"
    url = demo_url("redis://127.0.0.1:6379/0?prefix=mine:", tmp_path, "tag")
    assert url == "redis://127.0.0.1:6379/0?prefix=mine:"
    assert demo_url("redis://h/0", tmp_path, "tag") == "redis://h/0?prefix=tag:"


def test_live_view_shows_owners_kills_and_takeovers() -> None:
    state = DemoState(planned=10, t0=1)
    for r in [
        rec("hello", "w1", 2, pid=11),
        rec("hello", "w2", 3, pid=12),
        rec("event", "w1", 4, ev="wake", thread="thread-1", run_id="a.1", token=3),
        rec("run_start", "w1", 5, thread="thread-1", run_id="a.1", token=3),
        rec("sent", "w1", 6, sig="s1", thread="thread-1", outcome="wake"),
        rec("killed", COORDINATOR, 7, victim="w1", pid=11),
    ]:
        state.apply(r)
    buf = io.StringIO()
    console = Console(file=buf, width=140, color_system=None)
    console.print(render(state, "demo"))
    text = buf.getvalue()
    assert "w1 (dead)" in text
    assert "KILLED" in text
    assert "SIGKILL w1" in text
    state.apply(rec("event", "w2", 8, ev="wake", thread="thread-1", run_id="b.1", token=4))
    assert state.takeovers == 1
    assert state.threads["thread-1"].owner == "w2"
    buf.truncate(0)
    console.print(render(state, "demo"))
    assert "w2 took over thread-1 from w1 (token 4)" in buf.getvalue()


def test_evidence_records_are_json_lines(tmp_path: Path) -> None:
    # The worker's record format as the checker reads it back.
    from tenure.demo.worker import _Recorder

    path = tmp_path / "w9.jsonl"
    with path.open("a", encoding="utf-8") as out:
        _Recorder(out, "w9")("sent", sig="s1", thread="thread-1")
        # Flushed per record: visible before the file is closed.
        assert json.loads(path.read_text())["sig"] == "s1"
    (record,) = read_dir(tmp_path)
    assert record["w"] == "w9" and record["k"] == "sent" and isinstance(record["t"], int)
