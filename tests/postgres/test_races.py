"""Races between real OS processes on the shared server (a fresh schema per test)."""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Iterator

import pytest

from tests.postgres.helpers import (
    drop_schema,
    first_use_worker,
    new_schema,
    race_worker,
    run_in_processes,
)

PROCESSES = 4
ROUNDS = 40


@pytest.fixture
def fresh_schema(postgres_url: str) -> Iterator[str]:
    name = new_schema()
    yield name
    drop_schema(postgres_url, name)


def test_exactly_one_winner_per_round_and_tokens_increase(
    postgres_url: str, fresh_schema: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    key = "race\0key"
    per_process = run_in_processes(
        race_worker,
        [(postgres_url, fresh_schema, key, f"p{i}", ROUNDS, barrier) for i in range(PROCESSES)],
        ctx,
    )

    tokens = []
    for r in range(ROUNDS):
        attempts = [results[r] for results in per_process]
        winners = [a for a in attempts if a[1]]
        assert len(winners) == 1, (r, attempts)
        _, _, owner, token = winners[0]
        assert token is not None
        # Every loser was told the winner's name, read in the same atomic step.
        assert all(a[2] == owner for a in attempts), (r, attempts)
        tokens.append(token)
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens


def test_concurrent_first_use_creates_the_table_once(postgres_url: str, fresh_schema: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    processes = 6
    barrier = ctx.Barrier(processes)
    results = run_in_processes(
        first_use_worker,
        [(postgres_url, fresh_schema, "first", f"p{i}", barrier) for i in range(processes)],
        ctx,
    )
    winners = [owner for acquired, owner in results if acquired]
    assert len(winners) == 1, results
    assert {owner for _, owner in results} == {winners[0]}
