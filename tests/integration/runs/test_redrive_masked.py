"""A re-drive of a masked feed (``masking:`` with ``keep_raw``) against the real cluster.

A JSON feed hashes ``customer.email`` and the Kafka key and redacts ``customer.name`` and the
``x-user`` header, all of which carry a marker string; ``keep_raw`` keeps its quarantined
records' raw bytes apart. Poison records of two kinds (JSON cut short after the marker and
tombstones, which do not decode; ``tier: x-…``, which the rule refuses) are quarantined, and
so are records whose *hashed* email breaks a second rule (it sees the digest, as a run's
rules do, so the re-drive must mask before it codes); then the rule on ``tier`` is fixed.
The expectation comes from an independent ``read_committed`` scan of the committed offsets,
classified under the *fixed* rule here (not by Tidemark), its values masked here with
``cryptography``'s HKDF and Python's ``hmac`` (the feed's and the field's own key): after
the re-drive the feed's published rows (its Parquet publications, or its Iceberg table's
rows) must be exactly that good set, each once and masked as a run
masks, and the marker must be found in no file outside ``keep_raw`` (output, run dirs,
reports, staging, state), nor in the dead-letter listing or the re-drive's verdicts. A dead
letter whose raw bytes someone deleted from ``keep_raw`` stays a dead letter, its reason
naming where they should be.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv, scan
from tests.integration.job.test_masking import file_texts
from tests.support.masking import hashed, strong_key
from tests.support.poison import JSON_DDL, kind_of, produce_json_with_poison
from tidemark.config.masking import MASKED, MASKING_KEY_ENV
from tidemark.output.deadletters import dead_letters, summarize
from tidemark.runs.redrive import redrive_feed
from tidemark.runs.report import load_report

pytestmark = [pytest.mark.integration, pytest.mark.spark]

KEY = strong_key()
STRICT, FIXED = "^v-", "^[vx]-"
HASHED_RULE = "^[0-3]"  # a rule on the hashed email: it sees the digest, so only masking decides who breaks it
Masked = tuple[Any, ...]  # a published record's masked fields: id, email, name, tier, key, headers
Row = tuple[str, int, int, Masked]


def mac(text: str, field: str = "customer.email") -> str:
    """The hash the feed publishes for ``text`` in ``field``: HKDF + HMAC computed apart (tests.support.masking)."""
    return hashed(text, field, KEY, "faults")


def feed_doc(keep_raw: Path, regex: str) -> dict[str, Any]:
    return {
        "deserialization": {"format": "json", "schema_ddl": JSON_DDL},
        "validation": {
            "on_bad_records": "quarantine", "quarantine_max_ratio": 0.9,
            "expectations": [
                {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "tier", "regex": regex}},
                {"type": "expect_column_values_to_not_match_regex",
                 "kwargs": {"column": "customer.email", "regex": HASHED_RULE}},
            ],
        },
        "masking": {
            "fields": {"customer.email": "hash", "customer.name": "redact"},
            "key": "hash", "headers": {"x-user": "redact"}, "keep_raw": str(keep_raw),
        },
    }  # fmt: skip


def masked_as_expected(doc: dict[str, Any], marker: str) -> Masked:
    """What a run publishes for ``doc``, computed here: the email and key HMAC'd, the name and header redacted."""
    i = doc["id"]
    return (i, mac(doc["customer"]["email"]), MASKED, doc["tier"], mac(f"{marker}-key-{i}", "key"),
            (("x-user", MASKED), ("origin", f"h{i}")))  # fmt: skip


def oracle_good(env: FaultEnv, regex: str, marker: str) -> Counter[Row]:
    """The committed records that decode, pass ``regex`` on ``tier`` and whose email's HMAC does not match
    :data:`HASHED_RULE`, from a read_committed scan, masked here."""
    ranges = {(env.topic, p): (0, c or 0) for p, c in env.committed().items()}
    good: Counter[Row] = Counter()
    for (topic, partition, offset, _), value in scan(env.kafka.connection, ranges):
        try:
            doc = json.loads(value) if value is not None else None
        except ValueError:  # cut short, or not UTF-8
            continue
        if doc is None or doc.get("id") is None:  # a tombstone: the required id is missing
            continue
        if re.search(regex, doc["tier"]) and not re.search(HASHED_RULE, mac(doc["customer"]["email"])):
            good[(topic, partition, offset, masked_as_expected(doc, marker))] += 1
    return good


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def chosen_marker() -> str:
    """A fresh marker under which, of the first 30 records, some that the rule on ``tier`` refuses pass the rule on
    the hashed email (the re-drive has something to publish) and some refused ones do not (they stay)."""
    while True:
        marker = "ZQXMARK" + uuid.uuid4().hex[:12]
        hashed = {re.search(HASHED_RULE, mac(f"{marker}.{i}@example.com")) is not None
                  for i in range(30) if kind_of(i) == "refused"}  # fmt: skip
        if hashed == {True, False}:
            return marker


def published(env: FaultEnv) -> Counter[Row]:
    """The good records the feed's output shows: every shown publication of its Parquet output (not the
    quarantine), or its Iceberg table's rows."""
    found: list[tuple[str, dict[str, Any]]] = []
    if env.iceberg is not None:
        table = env.iceberg_table()
        found += [(r["topic"], r) for r in (table.scan().to_arrow().to_pylist() if table is not None else [])]
    for path in sorted(Path(env.output).glob("plan_id=*/topic=*/**/*.parquet")) if env.iceberg is None else ():
        topic = next(p[len("topic=") :] for p in path.parts if p.startswith("topic="))
        found += [(topic, r) for r in pq.read_table(path).to_pylist()]
    rows: Counter[Row] = Counter()
    for topic, r in found:
        headers = tuple((h["key"], _text(h["value"])) for h in r["headers"])
        fields = (r["id"], r["customer"]["email"], r["customer"]["name"], r["tier"], _text(r["key"]), headers)
        rows[(topic, r["partition"], r["offset"], fields)] += 1
    return rows


def leaks(root: Path, secured: Path, marker: str) -> list[str]:
    """Every file under ``root`` outside ``secured`` whose bytes or Parquet rows hold ``marker``."""
    return sorted(
        {str(p.relative_to(root)) for p, t in file_texts(root) if marker in t and not p.is_relative_to(secured)}
    )


@pytest.mark.parametrize("output", ["parquet", "iceberg"])
def test_a_masked_feed_with_keep_raw_redrives_from_the_raw_bytes_and_publishes_them_masked_once(
    kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest, output: str,
) -> None:  # fmt: skip
    env = FaultEnv(kafka, spark, tmp_path, request.node.name)
    env.install(monkeypatch)
    if output == "iceberg":
        env.use_iceberg(f"rm.t_{env.topic.replace('-', '_')}")
    monkeypatch.setenv(MASKING_KEY_ENV, KEY)
    monkeypatch.setenv("TIDEMARK_STAGING_DIR", str(tmp_path / "staging"))
    secured = tmp_path / "secured"
    marker = chosen_marker()
    env.write_feed(**feed_doc(secured, STRICT))
    produce_json_with_poison(env, 30, marker)
    _, job, outcome = env.run()
    assert outcome.committed
    before = dead_letters(env.feed)
    good_before = published(env)
    assert good_before == oracle_good(env, STRICT, marker)  # the run published them masked, as computed here
    assert len(before) == job["records_quarantined"] == 30 - len(good_before)

    env.write_feed(**feed_doc(secured, FIXED))
    first = redrive_feed(env.spark, env.feed, root=env.root)
    want = oracle_good(env, FIXED, marker)
    passing = len(want) - len(good_before)
    assert passing > 0 and (first.state, first.published, first.passing) == ("shown", passing, passing)
    got = published(env)
    assert [r for r, n in got.items() if n > 1] == [], "a record is in the feed's output twice"
    assert got == want  # the oracle's good set under the fixed rule, masked as a run masks
    left = dead_letters(env.feed)
    assert len(left) == len(before) - passing and all(d.rechecked_by == first.run_id for d in left)
    assert {d.reason_codes for d in left} == {
        ("decode_error",),
        ("expect_column_values_to_not_match_regex(customer.email)",),
    }
    report = load_report(str(first.run_id), env.feed, root=env.root)
    assert report.status == "succeeded" and report.counts["published"] == passing

    second = redrive_feed(env.spark, env.feed, root=env.root)
    assert (second.state, second.published, second.passing) == ("shown", 0, 0)
    assert published(env) == want

    # Someone deletes a plan's raw bytes: its dead letters stay, each reason naming the plan, the record and where
    # its bytes should be; nothing of them is published (the masked columns are never published in their place).
    env.write_feed(**feed_doc(secured, STRICT))
    produce_json_with_poison(env, 15, marker)
    handle, _, outcome = env.run()
    assert outcome.committed
    kept = secured / f"plan_id={handle.plan_id}"
    assert kept.is_dir()
    shutil.rmtree(kept)
    env.write_feed(**feed_doc(secured, FIXED))
    shown = published(env)
    third = redrive_feed(env.spark, env.feed, root=env.root)
    assert (third.state, third.published, third.passing) == ("shown", 0, 0)
    assert published(env) == shown
    gone = [d for d in dead_letters(env.feed) if d.plan_id == handle.plan_id]
    assert gone and len(gone) == sum(1 for v in third.verdicts if v.letter.plan_id == handle.plan_id)
    for d in gone:
        [code] = d.reason_codes
        assert code.startswith("raw_bytes_missing(")
        for part in (handle.plan_id, f"{d.topic}[{d.partition}]", f"offset {d.offset}", str(kept)):
            assert part in code, (part, code)

    # The marker: in no file but keep_raw's, nor in the listing, its summary or the re-drives' verdicts.
    assert leaks(tmp_path, secured, marker) == []
    listing = dead_letters(env.feed, redriven_too=True)
    outputs = repr(listing) + json.dumps([g.to_dict() for g in summarize(listing)])
    outputs += json.dumps([v.letter.to_dict() for o in (first, second, third) for v in o.verdicts])
    assert marker not in outputs
    kept_rows = [row for p in secured.rglob("*.parquet") for row in pq.read_table(p).to_pylist()]
    assert any(row["value"] is not None and marker.encode() in row["value"] for row in kept_rows)
