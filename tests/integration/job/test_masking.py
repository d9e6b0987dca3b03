"""Sensitive fields never leave the job unmasked: a marker searched for in every artefact of a run, real cluster.

A JSON feed's records carry a known marker in a nested value field (``customer.email``,
hashed), another (``customer.name``, truncated), a dropped one (``customer.phone``), the
Kafka key (hashed) and a header (redacted). Some records break a rule on an unmasked field,
some a rule on the hashed email (so GX lists unexpected *masked* values), some do not decode
(truncated JSON holding the marker): dead letters of every kind. After the run, every file
under the test's folders (the Parquet or Iceberg output and its metadata, the quarantine and
dead letters, the staging folder, the run's plan, job.json, report, run.json, validation
summary, GX Data Docs, the ``spark-submit`` log, the checkpoint store and the catalog) is
searched for the marker, Parquet files also decoded row by row, and so are the dead-letter
listing, the lineage the plan task would send, the metrics the tasks would send and the
view's pages (its Data Docs included): the marker is found only in the ``keep_raw``
location, where it must be found. The masking key itself is found nowhere.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv
from tests.integration.job.test_avro import AvroEnv, env_of
from tests.support.airflow_auth import GRANTS_ENV, PATH
from tests.support.masking import hashed, strong_key
from tidemark.config.masking import MASKING_KEY_ENV
from tidemark.config.models import load_feed
from tidemark.errors import ConfigError
from tidemark.kafka.admin import Record
from tidemark.output.deadletters import dead_letters
from tidemark.planning.plan import Plan
from tidemark.web.app import create_app

pytestmark = [pytest.mark.integration, pytest.mark.spark]

KEY = strong_key()
DDL = "id long NOT NULL, customer struct<email: string, name: string, phone: string>, amount long"
RECORDS = 40


def mac(text: str, field: str = "customer.email", feed: str = "faults") -> str:
    """The hash the feed publishes for ``text`` in ``field``: HKDF + HMAC computed apart (tests.support.masking)."""
    return hashed(text, field, KEY, feed)


def produce(env: FaultEnv, marker: str) -> dict[str, int]:
    """The records, and how many of each kind the oracle expects: every 7th does not decode, every 4th has a
    negative amount, and those whose hashed email starts with 0-3 break the rule on the hashed email."""
    records, kinds = [], {"undecodable": 0, "refused": 0, "good": 0}
    for i in range(RECORDS):
        email = f"{marker}.{i}@example.com"
        doc = {"id": i, "customer": {"email": email, "name": f"{marker}-n{i}", "phone": f"{marker}-p{i}"},
               "amount": -5 if i % 4 == 1 else i}  # fmt: skip
        value = json.dumps(doc).encode()
        if i % 7 == 3:
            value, kind = value[: value.index(b"@")], "undecodable"  # the marker, then no end
        elif i % 4 == 1 or mac(email)[0] in "0123":
            kind = "refused"
        else:
            kind = "good"
        kinds[kind] += 1
        records.append(Record(value=value, key=f"{marker}-key-{i}".encode(), partition=i % env.partitions,
                              headers=(("x-user", f"{marker}-h{i}".encode()), ("trace", b"t"))))  # fmt: skip
    env.kafka.produce(env.topic, records)
    return kinds


def feed_doc(keep_raw: Path | None) -> dict[str, Any]:
    masking: dict[str, Any] = {
        "fields": {"customer.email": "hash", "customer.name": {"truncate": 3}, "customer.phone": "drop"},
        "key": "hash",
        "headers": {"x-user": "redact"},
    }
    if keep_raw is not None:
        masking["keep_raw"] = str(keep_raw)
    return {
        "deserialization": {"format": "json", "schema_ddl": DDL},
        "validation": {
            "on_bad_records": "quarantine",
            "quarantine_max_ratio": 0.9,
            "expectations": [
                {"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "min_value": 0}},
                {
                    "type": "expect_column_values_to_not_match_regex",
                    "kwargs": {"column": "customer.email", "regex": "^[0-3]"},
                },
            ],
        },
        "masking": masking,
    }


def file_texts(root: Path) -> Iterator[tuple[Path, str]]:
    """Every file under ``root`` as text (its bytes as Latin-1), and each Parquet file's rows decoded as well
    (a compressed page need not hold a value's bytes as they are)."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        yield path, path.read_bytes().decode("latin-1")
        if path.name.endswith(".parquet"):
            yield path, repr(pq.read_table(path).to_pylist())


@pytest.fixture
def reader_token(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], str]]:
    """A read-only user of the feed's DAG under Airflow's configured auth manager, as the plugin serves the
    view (``tests.support.airflow_auth``); a function giving the user's token."""
    from airflow.api_fastapi import app as airflow_app
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.models.revoked_token import RevokedToken

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", PATH)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "reader:viewer")
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", uuid.uuid4().hex * 2)  # 64 bytes, as HS512 wants
    monkeypatch.setenv(GRANTS_ENV, json.dumps({"reader": {"tidemark_faults": "read"}}))
    monkeypatch.setattr(RevokedToken, "is_revoked", classmethod(lambda cls, jti, session=None: False))
    airflow_app.purge_cached_app()
    manager = airflow_app.create_auth_manager()
    yield lambda: str(manager.generate_jwt(SimpleAuthManagerUser(username="reader", role="viewer")))
    airflow_app.purge_cached_app()


def view_texts(env: FaultEnv, run_dirs: list[Path], token: Callable[[], str]) -> Iterator[tuple[str, str]]:
    """The view's pages for the feed, as its reader sees them through Airflow's auth: the index, the feed's page
    and API, its dead letters' page and API, and every run's Data Docs files served through the view."""
    from tidemark.orchestration.access import AirflowFeedAccess
    from tidemark.orchestration.dags import airflow_auth

    app = create_app(connection=lambda: env.kafka.connection, dependencies=airflow_auth(), access=AirflowFeedAccess())
    client = TestClient(app, headers={"Authorization": f"Bearer {token()}"})
    assert TestClient(app).get(f"/feeds/{env.feed}").status_code in (401, 403)  # the pages below need the user
    pages = ["/", "/api/feeds", f"/api/feeds/{env.feed}", f"/feeds/{env.feed}", f"/feeds/{env.feed}/deadletters",
             f"/api/feeds/{env.feed}/deadletters"]  # fmt: skip
    for run_dir in run_dirs:
        if (run_dir / "gx").is_dir():
            pages.append(f"/runs/{env.feed}/{run_dir.name}/docs")
            pages += [f"/runs/{env.feed}/{run_dir.name}/files/{p.relative_to(run_dir)}"
                      for p in (run_dir / "gx").rglob("*") if p.is_file()]  # fmt: skip
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, (page, response.status_code)
        yield page, response.text


def lineage_and_metrics(env: FaultEnv, monkeypatch: pytest.MonkeyPatch, run_dir: Path) -> str:
    """What the plan and commit tasks would send: the lineage description and every metric with its tags."""
    from tidemark.orchestration import lineage, metrics

    sent: list[Any] = []

    class Recorder:
        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: sent.append((name, args, kwargs))

    monkeypatch.setattr(metrics, "stats", Recorder())
    plan = Plan.from_json((run_dir / "plan.json").read_text())
    metrics.planned(plan)
    metrics.finished(env.feed, str(run_dir), str(run_dir / "report.json"), committed=True)
    assert sent, "the tasks send metrics for a run"
    described = lineage.describe(load_feed(env.feed), plan, env.kafka.connection.bootstrap_servers)
    return json.dumps(described) + repr(sent)


@pytest.mark.parametrize(("output", "keep_raw"), [("parquet", True), ("iceberg", False)])
def test_a_sensitive_marker_is_found_in_no_artefact_but_the_keep_raw_location(
    kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest, reader_token: Callable[[], str], output: str, keep_raw: bool,
) -> None:  # fmt: skip
    env = FaultEnv(kafka, spark, tmp_path, request.node.name)
    env.install(monkeypatch)
    monkeypatch.setenv(MASKING_KEY_ENV, KEY)
    monkeypatch.setenv("TIDEMARK_STAGING_DIR", str(tmp_path / "staging"))
    if output == "iceberg":
        env.use_iceberg(f"mask.t_{env.topic.replace('-', '_')}")
    secured = tmp_path / "secured" if keep_raw else None
    env.write_feed(**feed_doc(secured))
    marker = "ZQXMARK" + uuid.uuid4().hex[:12]
    kinds = produce(env, marker)

    # The Parquet feed's job runs as in production, through spark-submit (its log in the run dir); the
    # Iceberg feed's in this session.
    handle, job, outcome = env.run(master="local[1]" if output == "parquet" else None)
    assert outcome.committed
    assert job["records_read"] == RECORDS and job["decode_failures"] == kinds["undecodable"]
    assert job["records_published"] == kinds["good"]
    assert job["records_quarantined"] == kinds["undecodable"] + kinds["refused"]
    run_dir = Path(handle.run_dir)
    assert (run_dir / "report.json").exists() and list((run_dir / "gx").rglob("*.html"))
    if output == "parquet":
        assert (run_dir / "spark-submit.log").exists()

    texts = dict(file_texts(tmp_path))
    letters = dead_letters(env.feed)
    assert len(letters) == job["records_quarantined"]
    others = {
        "dead letters": repr(letters),
        "lineage and metrics": lineage_and_metrics(env, monkeypatch, run_dir),
        **{f"view {page}": text for page, text in view_texts(env, [run_dir], reader_token)},
    }
    assert env.feed in others["view /"] and env.topic in others[f"view /feeds/{env.feed}"]  # the reader sees it
    assert any("/files/gx/" in name and "validation" in text.lower() for name, text in others.items())
    if output == "iceberg":
        from tidemark.output.iceberg import open_catalog

        table = open_catalog().load_table(load_feed(env.feed).iceberg_table)
        others["iceberg rows"] = repr(table.scan().to_arrow().to_pylist())
        others["iceberg file metrics"] = repr(table.inspect.files().to_pylist())

    found = sorted({str(p.relative_to(tmp_path)) for p, t in texts.items() if marker in t}
                   | {name for name, t in others.items() if marker in t})  # fmt: skip
    expected = sorted({str(p.relative_to(tmp_path)) for p in texts if secured and p.is_relative_to(secured)})
    assert found == [p for p in expected if marker in texts[tmp_path / p]], f"the marker leaked into {found}"
    assert not [p for p, t in {**{str(k): v for k, v in texts.items()}, **others}.items() if KEY in t]

    # What masking left: the published email is the HMAC a reader can recompute, the name three characters.
    published = texts if output == "parquet" else {Path("iceberg"): others["iceberg rows"]}
    good = [
        i for i in range(RECORDS) if i % 7 != 3 and i % 4 != 1 and mac(f"{marker}.{i}@example.com")[0] not in "0123"
    ]
    assert all(any(mac(f"{marker}.{i}@example.com") in t for t in published.values()) for i in good)
    assert any(mac(f"{marker}-key-{good[0]}", "key") in t for t in published.values())
    # GX listed the unexpected values of the rule on the hashed email: masked ones, in the Data Docs.
    docs = " ".join(t for p, t in texts.items() if p.is_relative_to(run_dir / "gx"))
    refused = [i for i in range(RECORDS) if i % 7 != 3 and mac(f"{marker}.{i}@example.com")[0] in "0123"]
    assert refused and any(mac(f"{marker}.{i}@example.com") in docs for i in refused)
    if secured is not None:  # the raw bytes of every dead letter, and only of those, are kept there
        raw = [row for p in secured.rglob("*.parquet") for row in pq.read_table(p).to_pylist()]
        assert len(raw) == job["records_quarantined"]
        assert all(marker.encode() in row["value"] and row["key"].startswith(marker.encode()) for row in raw)
        assert all(
            h["value"].startswith(marker.encode()) for row in raw for h in row["headers"] if h["key"] == "x-user"
        )


CUSTOMER = {  # flat: the read tasks stage such values themselves (nested records are Spark's to decode)
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "email", "type": "string"}, {"name": "tier", "type": "string"}],
}  # fmt: skip


class MaskedAvroEnv(AvroEnv):
    feed_options: ClassVar[dict[str, Any]] = {  # the data source reads, so the read tasks would stage
        "driver_read_max_records": 0,
        "masking": {"fields": {"email": "hash"}, "key": "redact"},
    }


def test_an_avro_feed_the_read_tasks_would_stage_is_masked_by_spark_and_its_paths_are_checked_when_planned(
    kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = env_of(MaskedAvroEnv, kafka, registry, tmp_path, spark, monkeypatch)
    monkeypatch.setenv(MASKING_KEY_ENV, KEY)
    monkeypatch.setenv("TIDEMARK_STAGING_DIR", str(tmp_path / "staging"))
    env.write_feed([{"type": "expect_column_values_to_be_between", "kwargs": {"column": "id", "min_value": 0}}])
    marker = "ZQXMARK" + uuid.uuid4().hex[:12]
    serialize = env.serializer(CUSTOMER)
    for partition in range(2):
        env.produce([serialize({"id": i, "email": f"{marker}.{partition}.{i}@x", "tier": "t"}) for i in range(30)],
                    partition)  # fmt: skip

    _, job, outcome = env.run()

    assert outcome.committed and job["reader"] == "data_source"
    assert job["staged_by"] == "spark"  # the read tasks do not mask: they leave a masked feed to Spark
    published = env.published()
    assert len(published) == 2 * 30
    assert {r["email"] for r in published.values()} == {
        mac(f"{marker}.{p}.{i}@x", "email", "orders") for p in range(2) for i in range(30)
    }
    assert {r["key"] for r in published.values()} == {"[masked]"}
    # Every record decodes and passes (one that did not would make the read tasks give way to Spark anyway).
    assert env.quarantined() == []
    leaked = sorted(str(p.relative_to(tmp_path)) for p, t in file_texts(tmp_path) if marker in t)
    assert leaked == [], f"the marker leaked into {leaked}"

    # A path the registry's reader schema lacks is refused when the run is planned, naming it: no run, no read.
    env.feed_options = {**MaskedAvroEnv.feed_options, "masking": {"fields": {"phone": "hash"}}}
    env.write_feed()
    env.kafka.produce(env.topic, [Record(value=serialize({"id": 1, "email": "a", "tier": "b"}), partition=1)])
    runs = len(list(env.root.glob("runs/orders/*")))
    refusal = (
        r"masking.fields.phone: the declared schema has no field 'phone' \(its fields: email, id, tier\), in the reader"
    )
    with pytest.raises(ConfigError, match=refusal):
        env.run()
    assert len(list(env.root.glob("runs/orders/*"))) == runs
