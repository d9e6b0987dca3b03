"""A re-drive is a run of the feed's one commit protocol: a crash anywhere in it is settled by the feed's next run.

The re-drive is killed (a fault point raising, or ending the process as ``kill -9`` would)
after it staged its publication, or after its output commit (the Parquet manifest's rename,
the Iceberg catalog commit) and before the run ledger records it. The next *scheduled* run
of the feed, not another re-drive, settles it as it settles any open run. The oracle is
independent of Tidemark: the records a ``read_committed`` scan of the topic classifies as bad
under the feed's first rule and good under the fixed one (the dead letters the re-drive
must take), checked against the quarantine files read with pyarrow (Parquet) or the
dead-letter table read with pyiceberg (Iceberg) before the re-drive, and the feed's good
output read with pyarrow or pyiceberg after: each of them exactly once there, and no longer
listed as a dead letter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import GOOD, QUARANTINED, FaultEnv
from tests.integration.runs.test_redrive import FIXED_RULE, oracle, x_rows
from tests.support.poison import produce_with_poison, table_rows
from tidemark.faults import FAULTS_ENV, InjectedFault
from tidemark.output.deadletters import dead_letters
from tidemark.runs.redrive import redrive_feed
from tidemark.runs.run import open_checkpoints

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         request: pytest.FixtureRequest) -> FaultEnv:  # fmt: skip
    env = FaultEnv(kafka, spark, tmp_path, request.node.name)
    env.install(monkeypatch)
    return env


def _redrive_killed(fenv: FaultEnv, point: str) -> None:
    """``tidemark redrive`` in a process of its own, ended at ``point`` with exit code 137 (no handler runs)."""
    env = {**os.environ, FAULTS_ENV: f"{point}:exit", "TIDEMARK_FEEDS_DIR": str(fenv.feeds),
           "TIDEMARK_STATE_DIR": str(fenv.root)}  # fmt: skip
    env.pop("TIDEMARK_SPARK_MASTER", None)
    done = subprocess.run([sys.executable, "-m", "tidemark.cli", "redrive", fenv.feed], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 137, done.stderr[-3000:]


@pytest.mark.parametrize(
    ("point", "output", "how"),
    [("redrive.after_stage", "parquet", "raise"), ("commit.after_show", "parquet", "raise"),
     ("redrive.after_stage", "iceberg", "raise"), ("commit.after_show", "iceberg", "raise"),
     ("commit.after_show", "parquet", "kill")],
)  # fmt: skip
def test_a_redrive_killed_before_its_bookkeeping_is_settled_by_the_next_scheduled_run_once(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch, point: str, output: str, how: str
) -> None:
    if output == "iceberg":
        fenv.use_iceberg(f"rl.t_{fenv.topic.replace('-', '_')}")
    produce_with_poison(fenv, 30)
    fenv.run()
    bad_then = set(oracle(fenv)[QUARANTINED])
    # The dead letters as the output holds them, read without Tidemark: each bad record once.
    listed = table_rows(fenv) if output == "iceberg" else fenv.published_by_kind()[QUARANTINED]
    assert listed == Counter(bad_then)
    good_before = fenv.published_by_kind()[GOOD]
    fenv.write_feed(validation=FIXED_RULE)
    passing = bad_then & set(oracle(fenv)[GOOD])  # bad under the first rule, good under the fixed one
    assert len(passing) == 3 and x_rows(fenv, dead_letters(fenv.feed)) == passing

    if how == "kill":
        _redrive_killed(fenv, point)
    else:
        monkeypatch.setenv(FAULTS_ENV, point)
        with pytest.raises(InjectedFault):
            redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
        monkeypatch.delenv(FAULTS_ENV)

    produce_with_poison(fenv, 15)
    fenv.run()  # the next scheduled run: it settles the open re-drive before it plans
    store = open_checkpoints(fenv.root)
    assert [r.run_id for r in store.open_runs(fenv.feed) + store.open_runs(f"{fenv.feed}:redrive")] == []
    good = fenv.published_by_kind()[GOOD]
    assert {row: good[row] for row in passing} == dict.fromkeys(passing, 1)  # each re-driven record exactly once
    assert [r for r, n in good.items() if n > 1] == []
    assert set(good) == set(oracle(fenv)[GOOD]) and set(good_before) <= set(good)
    assert x_rows(fenv, dead_letters(fenv.feed)) == set()  # no longer listed as dead letters
    again = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (again.published, again.passing) == (0, 0)
    assert fenv.published_by_kind()[GOOD] == good
