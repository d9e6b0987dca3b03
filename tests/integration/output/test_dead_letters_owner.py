"""A feed lists and re-drives only the dead letters of plans it wrote, against the real cluster.

A second feed (another team's, loaded from its own feeds folder) publishes plans with
poison records where the first feed looks: into the first feed's Parquet folder, or into
its Iceberg table with the quarantine folders beside the same output. The first feed's
listing must hold exactly the records the oracle (a ``read_committed`` scan of its own
topic, classified under its rule) quarantined, and its re-drive must publish none of the
other feed's records into either output.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import GOOD, QUARANTINED, FaultEnv
from tests.integration.runs.test_redrive import FIXED_RULE, oracle
from tests.support.poison import produce_with_poison
from tidemark.errors import ConfigError
from tidemark.output.deadletters import dead_letters
from tidemark.runs.redrive import redrive_feed

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.mark.parametrize("output", ["parquet", "iceberg"])
def test_a_feed_lists_and_redrives_only_the_plans_it_wrote(
    kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    ours = FaultEnv(kafka, spark, tmp_path / "ours", "owner-ours")
    theirs = FaultEnv(kafka, spark, tmp_path / "theirs", "owner-theirs", feed="theirs")
    theirs.root = ours.root  # one state dir (and Iceberg catalog); each feed file in its own folder
    if output == "iceberg":
        ours.use_iceberg(f"own.t_{ours.topic.replace('-', '_')}")
        theirs.iceberg = ours.iceberg
    theirs.write_feed(output=str(ours.output))  # their plans where ours are

    theirs.install(monkeypatch)
    produce_with_poison(theirs, 30)
    theirs.run()
    ours.install(monkeypatch)
    produce_with_poison(ours, 12)
    if output == "iceberg":
        # The table now carries its owner (tidemark.owner): a second feed can no longer write into it, so its
        # listing never meets the other feed's plans there; the refusal names both feeds and moves nothing.
        with pytest.raises(ConfigError, match="belongs to feed 'theirs'"):
            ours.run()
        assert set(ours.committed().values()) == {None}
        return
    ours.run()

    listed = dead_letters(ours.feed)
    assert {d.topic for d in listed} == {ours.topic}, "another feed's dead letters are listed as this feed's"
    assert {(d.topic, d.partition, d.offset) for d in listed} == {r[:3] for r in oracle(ours)[QUARANTINED]}

    ours.write_feed(validation=FIXED_RULE)
    done = redrive_feed(ours.spark, ours.feed, root=ours.root)
    assert done.published == done.passing == 2  # x-2 and x-9: their x-… records are not ours to re-drive
    assert all(v.letter.topic == ours.topic for v in done.verdicts)
    # The shared output holds both feeds' records: each feed's topic is its oracle's good set, each once.
    for env in (ours, theirs):
        got = Counter({r: n for r, n in ours.published_by_kind()[GOOD].items() if r[0] == env.topic})
        assert [r for r, n in got.items() if n > 1] == [], f"a record of {env.feed} is in the output twice"
        assert set(got) == set(oracle(env)[GOOD])
