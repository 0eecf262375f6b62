"""The CI's safety run on a 3-member etcd cluster (leader kills, member pauses,
leader partitions, client faults): the same short run and checks as every
backend's in ``test_ci_runs``. The negative controls are not repeated here:
they wrap any backend alike and run on the others. The long soak is
``python -m safety soak --backend etcd`` (SAFETY.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.safety.test_ci_runs import test_short_run_with_faults_has_no_violation as short_run


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_short_run_on_a_faulty_etcd_cluster_has_no_violation(tmp_path: Path) -> None:
    short_run("etcd", tmp_path)
