"""What a re-drive took lives in the run ledger, not in its run folder, against the real cluster.

A re-drive publishes the dead letters the fixed rule passes; the feed's rule is made strict
again and a normal run quarantines new ``x-…`` records; the rule is fixed again. Then every
run folder of the feed is removed (as a state-dir clean-up would): the listing must not
offer the letters the first re-drive took, and a second re-drive must publish only the new
ones. The expectation is the fault suite's oracle: a ``read_committed`` scan of the
committed offsets classified under the fixed rule, not Tidemark's view of itself. On a
Parquet feed with the run ledger in SQLite and on an Iceberg feed with it in PostgreSQL.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import GOOD, QUARANTINED, FaultEnv, digest
from tests.integration.runs.test_redrive import FIXED_RULE, assert_output_is_the_oracles_good_set, good_output, oracle
from tests.support.poison import produce_with_poison
from tidemark.output.deadletters import REDRIVE_FILE, dead_letters
from tidemark.runs.redrive import redrive_feed

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture(params=["parquet-sqlite", "iceberg-postgres"])
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         request: pytest.FixtureRequest) -> FaultEnv:  # fmt: skip
    if request.param == "iceberg-postgres":
        monkeypatch.setenv("TIDEMARK_CHECKPOINT_URL", request.getfixturevalue("postgres"))
    env = FaultEnv(kafka, spark, tmp_path, request.node.name)
    env.install(monkeypatch)
    if request.param == "iceberg-postgres":
        env.use_iceberg(f"rl.t_{env.topic.replace('-', '_')}")
    return env


def _prune_run_folders(env: FaultEnv) -> int:
    runs = Path(str(env.root)) / "runs" / env.feed
    found = [p for p in runs.iterdir() if p.is_dir()]
    for folder in found:
        shutil.rmtree(folder)
    return len(found)


def _keys(letters: list[Any]) -> set[tuple[str, int, int, str]]:
    return {(d.topic, d.partition, d.offset, digest(d.value)) for d in letters}


def test_pruned_run_folders_change_nothing_a_redrive_took(fenv: FaultEnv) -> None:
    produce_with_poison(fenv, 30)
    fenv.run()
    fenv.write_feed(validation=FIXED_RULE)
    first = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (first.state, first.published) == ("shown", 3)
    taken_first = _keys(dead_letters(fenv.feed, redriven_too=True)) - _keys(dead_letters(fenv.feed))
    assert len(taken_first) == 3

    fenv.write_feed()  # the strict rule again: the next run quarantines its x-… records
    produce_with_poison(fenv, 30)
    fenv.run()
    fenv.write_feed(validation=FIXED_RULE)
    want_left = {r for r in oracle(fenv)[QUARANTINED]}  # still bad under the fixed rule
    listed = _keys(dead_letters(fenv.feed))
    new_x = {k for k in listed if k not in want_left}
    assert len(new_x) == 4 and not new_x & taken_first

    assert _prune_run_folders(fenv) >= 3
    assert not list((Path(str(fenv.root)) / "runs").rglob(REDRIVE_FILE))
    listed = _keys(dead_letters(fenv.feed))
    assert not listed & taken_first, "a dead letter a shown re-drive took is listed again"
    assert listed == want_left | new_x

    second = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (second.state, second.published) == ("shown", 4)
    got = good_output(fenv)
    assert [r for r, n in got.items() if n > 1] == [], "a re-driven record is in the output twice"
    assert_output_is_the_oracles_good_set(fenv)
    assert sum(got.values()) == sum(oracle(fenv)[GOOD].values())
    third = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (third.published, third.passing) == (0, 0)
    assert _keys(dead_letters(fenv.feed)) == want_left


def test_a_redrive_recorded_only_in_its_run_folder_is_adopted_and_one_recorded_nowhere_refuses(
    kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-drive recorded before the run ledger kept records (its letters only in ``redrive.json``): the listing
    reads its folder; with the folder gone the next re-drive refuses, naming it, rather than choose again; restored,
    the next re-drive copies it into the ledger, after which pruning changes nothing."""
    import sqlite3

    from tidemark.errors import StuckRunError

    env = FaultEnv(kafka, spark, tmp_path, "legacy")
    env.install(monkeypatch)
    produce_with_poison(env, 30)
    env.run()
    env.write_feed(validation=FIXED_RULE)
    first = redrive_feed(env.spark, env.feed, root=env.root)
    assert first.published == 3
    with sqlite3.connect(Path(str(env.root)) / "checkpoints.sqlite") as db:  # as an older Tidemark left it
        db.execute("DELETE FROM redrives")
    left = _keys(dead_letters(env.feed))
    assert len(left) == 6  # its folder still says what it took

    folder = Path(str(env.root)) / "runs" / env.feed / str(first.run_id)
    shutil.move(folder, tmp_path / "kept")
    with pytest.raises(StuckRunError, match=rf"{first.run_id}.*redrive.json") as refused:
        redrive_feed(env.spark, env.feed, root=env.root)
    assert "twice" in str(refused.value)
    got = good_output(env)
    assert [r for r, n in got.items() if n > 1] == []

    shutil.move(tmp_path / "kept", folder)
    again = redrive_feed(env.spark, env.feed, root=env.root)  # adopts the folder's record, then chooses
    assert (again.published, again.passing) == (0, 0)
    _prune_run_folders(env)
    assert _keys(dead_letters(env.feed)) == left
    third = redrive_feed(env.spark, env.feed, root=env.root)
    assert (third.published, third.passing) == (0, 0)
    assert_output_is_the_oracles_good_set(env)
