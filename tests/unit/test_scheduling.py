"""How `make test` hands tests to xdist's workers: what must share one worker stays together."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ONE_WORKER_GROUPS, one_worker_scope

E2E = Path(__file__).parents[1] / "e2e"


def test_every_e2e_file_on_the_shared_airflow_is_in_its_group_and_the_others_go_a_file_at_a_time() -> None:
    shared = {p.name for p in E2E.glob("test_*.py") if "airflow: RunningAirflow" in p.read_text()}
    grouped = {prefix.rsplit("/", 1)[1] for prefix in ONE_WORKER_GROUPS["e2e"]}
    assert shared == grouped, "a test on the package's shared Airflow must be in the e2e group (and only those)"
    for path in sorted(E2E.glob("test_*.py")):
        scope = one_worker_scope(f"tests/e2e/{path.name}::test_x")
        assert scope == ("e2e" if path.name in shared else f"tests/e2e/{path.name}"), path.name


def test_a_test_outside_the_groups_is_its_own_scope() -> None:
    node = "tests/unit/test_redaction.py::test_x"
    assert one_worker_scope(node) == node
    assert one_worker_scope("tests/faults/test_scenarios.py::test_y") == "faults+registry"
