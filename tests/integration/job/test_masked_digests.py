"""A masked feed publishes no digest of its raw records: a guessed value cannot be tested against a range's checksum.

The per-range checksum (two XORs of Spark's unkeyed ``xxhash64`` of each record's topic,
partition, offset, key and value) and byte count go into the manifest, ``job.json``, the
report and the view's JSON. Of a one-record range they are the record's own digest: anyone
who sees them could hash guesses of a masked email until one matches. A masked feed's are of
its records as masked. The oracle computes the raw digest independently (Spark's
``xxhash64`` on the produced bytes) and an unmasked feed holding the same record shows that it
is the digest that would be published; the masked feed's files and the view hold it nowhere.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv
from tests.support.masking import strong_key
from tidemark.config.masking import MASKING_KEY_ENV
from tidemark.kafka.admin import Record
from tidemark.web.app import create_app

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DDL = "id long NOT NULL, email string"
MASK64 = 2**64 - 1


def raw_digest(spark: Any, topic: str, partition: int, offset: int, key: bytes, value: bytes) -> str:
    """The checksum of a one-record range over its raw bytes, as an attacker computes it for a guess."""
    from pyspark.sql import functions as F

    h1 = spark.range(1).select(F.xxhash64(F.lit(topic), F.lit(partition).cast("int"), F.lit(offset).cast("long"),
                                          F.lit(key), F.lit(value))).first()[0]  # fmt: skip
    h2 = spark.range(1).select(F.xxhash64(F.lit(h1).cast("long"), F.lit("tidemark"))).first()[0]
    return f"{h1 & MASK64:016x}{h2 & MASK64:016x}"


def one_record_run(env: FaultEnv, monkeypatch: pytest.MonkeyPatch, masking: dict[str, Any] | None,
                   value: bytes) -> dict[str, Any]:  # fmt: skip
    env.install(monkeypatch)
    doc: dict[str, Any] = {"deserialization": {"format": "json", "schema_ddl": DDL},
                           "validation": {"on_bad_records": "quarantine", "expectations": []}}  # fmt: skip
    if masking is not None:
        doc["masking"] = masking
    env.write_feed(**doc)
    env.kafka.produce(env.topic, [Record(value=value, key=b"customer-1", partition=0)])
    _handle, job, outcome = env.run()
    assert outcome.committed and job["records_published"] == 1
    return job


def texts_under(root: Path) -> dict[str, str]:
    return {str(p): p.read_bytes().decode("latin-1") for p in root.rglob("*") if p.is_file()}


def test_a_one_record_range_of_a_masked_feed_publishes_no_digest_a_guess_can_be_checked_against(
    kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    monkeypatch.setenv(MASKING_KEY_ENV, strong_key())
    monkeypatch.setenv("TIDEMARK_STAGING_DIR", str(tmp_path / "staging"))
    email = f"alice.{uuid.uuid4().hex[:6]}@example.com"
    value = json.dumps({"id": 1, "email": email}).encode()

    # Control: an unmasked feed with the same record publishes exactly the digest the oracle computes.
    plain = FaultEnv(kafka, spark, tmp_path / "plain", request.node.name, partitions=1)
    job = one_record_run(plain, monkeypatch, None, value)
    guessed = raw_digest(spark, plain.topic, 0, 0, b"customer-1", value)
    assert [r["checksum"] for r in job["ranges"]] == [guessed]

    masked = FaultEnv(kafka, spark, tmp_path / "masked", request.node.name, partitions=1)
    job = one_record_run(masked, monkeypatch, {"fields": {"email": "hash"}}, value)
    guess = raw_digest(spark, masked.topic, 0, 0, b"customer-1", value)
    wrong = raw_digest(spark, masked.topic, 0, 0, b"customer-1", value.replace(b"alice", b"bob"))
    (published,) = job["ranges"]
    assert published["records"] == 1 and published["checksum"] not in (None, "0" * 32, guess, wrong)
    assert published["bytes"] != len(value) + len(b"customer-1")  # not the raw bytes' length either
    found = texts_under(tmp_path / "masked")
    app = create_app(connection=lambda: kafka.connection, runs_root=masked.root)
    found["view"] = TestClient(app).get(f"/api/feeds/{masked.feed}").text
    shown = [r for run in json.loads(found["view"])["runs"] for r in run["ranges"]]
    assert shown and not [r for r in shown if "checksum" in r or "bytes" in r]  # no content figure of any run
    for half in (guess[:16], guess[16:]):
        assert not [name for name, text in found.items() if half in text], f"the raw digest is published: {half}"
    assert email not in "".join(found.values())
