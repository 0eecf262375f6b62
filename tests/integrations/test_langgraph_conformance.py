"""langgraph-checkpoint-conformance on the fenced savers and the savers they
extend, in the same run: the fenced ones pass exactly the tests the plain ones
pass (a token in the context: the suite's configs carry none)."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from tenure.integrations.langgraph import fencing_token
from tests.postgres.helpers import drop_schema, new_schema

from .langgraph_support import KINDS, create_schema, open_saver, schema_url

Outcomes = dict[tuple[str, str], bool]


async def _conformance(kind: str, *, fenced: bool, postgres_url: str) -> tuple[Outcomes, Any]:
    """Every conformance test's outcome for one saver, each capability on a fresh database."""
    made: list[str] = []
    scratch = tempfile.TemporaryDirectory(prefix="tenure-conformance-")

    async def lifespan() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            for schema in made:
                drop_schema(postgres_url, schema)
            scratch.cleanup()

    async def factory() -> AsyncGenerator[Any, None]:
        if kind.startswith("sqlite"):
            where = str(Path(scratch.name) / f"{len(made)}-{new_schema()}.db")
        else:
            schema = new_schema()
            made.append(schema)
            create_schema(postgres_url, schema)
            where = schema_url(postgres_url, schema)
        async with open_saver(kind, where, fenced=fenced) as saver:
            yield saver

    outcomes: Outcomes = {}

    def record(capability: str, test: str, passed: bool, error: str | None) -> None:
        outcomes[(capability, test)] = passed

    registered = checkpointer_test(
        name=f"{'fenced' if fenced else 'plain'}-{kind}", lifespan=lifespan
    )(factory)
    with fencing_token(1):
        report = await validate(registered, progress=ProgressCallbacks(on_test_result=record))
    return outcomes, report


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.asyncio
async def test_the_fenced_saver_passes_what_its_saver_passes(kind: str, postgres_url: str) -> None:
    plain, plain_report = await _conformance(kind, fenced=False, postgres_url=postgres_url)
    fenced, fenced_report = await _conformance(kind, fenced=True, postgres_url=postgres_url)
    detected = {name: result.detected for name, result in plain_report.results.items()}
    assert {n: r.detected for n, r in fenced_report.results.items()} == detected
    # The suite calls the async methods: a sync saver (PostgresSaver) has none of its own.
    assert plain or (kind == "postgres-sync" and not any(detected.values()))
    lost = sorted(test for test, passed in plain.items() if passed and not fenced.get(test))
    assert lost == [], f"passed by the saver, failed by the fenced saver: {lost}"
    assert fenced.keys() == plain.keys()
