"""The fault suite's oracle, invariants and scoreboard.

Every scenario runs real runs of one feed against the real cluster, injects a fault
(cluster fixture, process signals, admin calls, named fault points), lets Tidemark
recover, and then calls :meth:`FaultEnv.check`, which compares what the group committed
and what Tidemark published with an independent ``read_committed`` scan of the same
offsets (the oracle: ``(topic, partition, offset, sha256(value))`` per record):

- **I1** no partition's committed offset is past data that was not validated and
  published (every record below the committed offset is published or quarantined), and
  every record sits where the feed's expectations put it: good ones in the output, bad
  ones in its quarantine (classified from the raw bytes, :meth:`FaultEnv.classifier`; an
  Avro feed's by decoding them with fastavro against the registry's writer schema,
  :class:`AvroValues`, its good records compared by their decoded fields);
- **I2** the published output (good and quarantined records, across every plan folder)
  equals the oracle over what was committed: nothing lost, nothing twice, no record
  that Kafka does not hold at that offset;
- **I3** after the fault and the rerun, the output is what an undisturbed run gives:
  exactly the oracle set (checked at the end of every scenario, when nothing is left
  half done, as ``final=True``);
- **I4** errors name the topic, partition and offsets and say what to do: each scenario
  asserts its error's text with :func:`assert_names`.

Counts (records compared, good and quarantined, partitions, runs; lost, duplicated,
misrouted) go to a scoreboard that the suite prints at
the end and writes to ``tests/faults/last-run.json``; ``docs/faults.md`` is generated
from the scenario registry below and those counts (``make faults-table``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import yaml
from confluent_kafka import Consumer, KafkaError, TopicPartition

from tests.conftest import KafkaTestCluster
from tidemark.kafka.admin import Record
from tidemark.kafka.connection import KafkaConnection
from tidemark.output.base import QUARANTINE_DIR
from tidemark.runs.pipeline import CommitOutcome, RunHandle, run_feed
from tidemark.staged import RAW_VALUE_COLUMN, REASON_COLUMN
from tidemark.storage import Location

LOCAL = "local"
S3_STAGING = "s3+postgres+s3-staging"
S3_POSTGRES = "s3+postgres"
# The crash, overlap and retry scenarios run on every shape: the embedded default; state and
# output on S3 with checkpoints in PostgreSQL; and that with Spark staging on S3 too, as on a
# cluster without a shared disk (the fixture ``fenv`` reads the parameter). The middle shape is
# the third one's publish path with local staging: `make test` leaves it to `make test-extended`.
# ``ON_BOTH_SHAPES`` runs the third shape in `make test` too: the scenarios whose fault lands
# where that shape differs (staging and publishing on the object store, the PostgreSQL
# ledger's races). ``ON_EVERY_SHAPE`` leaves both deployment shapes to `make test-extended`:
# scenarios about Kafka, the registry and topic identity, which the shapes share.
ON_BOTH_SHAPES = pytest.mark.parametrize(
    "fenv", [LOCAL, pytest.param(S3_POSTGRES, marks=pytest.mark.extended), S3_STAGING], indirect=True
)
ON_EVERY_SHAPE = pytest.mark.parametrize(
    "fenv",
    [LOCAL, *(pytest.param(shape, marks=pytest.mark.extended) for shape in (S3_POSTGRES, S3_STAGING))],
    indirect=True,
)
Row = tuple[str, int, int, str]  # topic, partition, offset, sha256 of the value (hex)
F = TypeVar("F", bound=Callable[..., Any])
LAST_RUN = Path(__file__).with_name("last-run.json")


# -- the registry -----------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    number: str
    title: str
    injected: str
    asserted: str
    test: str = ""


SCENARIOS: dict[str, Scenario] = {}


def scenario(number: str, title: str, *, injected: str, asserted: str) -> Callable[[F], F]:
    """Register a test as a numbered scenario of issue 13 (the docs table is built from these)."""

    def register(fn: F) -> F:
        SCENARIOS[fn.__name__] = Scenario(number, title, injected, asserted, fn.__name__)
        return fn

    return register


@dataclass
class Tally:
    """What one scenario's oracle compared: totals over its checks (``partitions``, ``runs``: the most in one)."""

    records_checked: int = 0
    good_checked: int = 0
    quarantined_checked: int = 0
    records_lost: int = 0
    records_duplicated: int = 0
    records_misrouted: int = 0
    partitions: int = 0
    runs: int = 0
    checks: int = 0

    def compared(self, expected: Counter[Row], kinds: Mapping[Row, str]) -> None:
        """Count one oracle check: each distinct row once, as good or quarantined, so records = good + quarantined."""
        self.checks += 1
        for row in expected:
            self.records_checked += 1
            if kinds[row] == GOOD:
                self.good_checked += 1
            else:
                assert kinds[row] == QUARANTINED, f"unclassified oracle row {row}: {kinds[row]}"
                self.quarantined_checked += 1


SCOREBOARD: dict[str, Tally] = {}


# -- the oracle -------------------------------------------------------------------------


def digest(value: bytes | str | None) -> str:
    raw = b"" if value is None else value.encode() if isinstance(value, str) else bytes(value)
    return hashlib.sha256(raw).hexdigest()


def group_offsets(
    connection: KafkaConnection, group: str, tps: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], int | None]:
    """The group's committed offsets asked with a plain consumer that never joins the group."""
    consumer = Consumer(connection.client_config(**{"group.id": group, "enable.auto.commit": False}))
    try:
        found = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=30)
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found}


def store_fs() -> pafs.FileSystem:
    """pyarrow's S3 filesystem on the test's S3 server (the ``s3`` fixture's environment)."""
    endpoint = os.environ["TIDEMARK_S3_ENDPOINT"]
    return pafs.S3FileSystem(endpoint_override=endpoint, scheme=endpoint.split("://", 1)[0],
                             region=os.environ.get("AWS_REGION", "us-east-1"))  # fmt: skip


def oracle(connection: KafkaConnection, ranges: Mapping[tuple[str, int], tuple[int, int]]) -> Counter[Row]:
    """Every record in ``ranges`` as a read_committed consumer of our own sees it."""
    return Counter(row for row, _ in scan(connection, ranges))


def scan(
    connection: KafkaConnection, ranges: Mapping[tuple[str, int], tuple[int, int]]
) -> list[tuple[Row, bytes | None]]:
    """The oracle's rows with each record's value (to classify it against the feed's expectations)."""
    import time

    wanted = {tp: r for tp, r in ranges.items() if r[1] > r[0]}
    rows: list[tuple[Row, bytes | None]] = []
    if not wanted:
        return rows
    consumer = Consumer(
        connection.client_config(**{
            "group.id": f"oracle-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
            "isolation.level": "read_committed", "auto.offset.reset": "error", "enable.partition.eof": True,
        })
    )  # fmt: skip
    try:
        consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in wanted.items()])
        done: set[tuple[str, int]] = set()
        deadline = time.monotonic() + 60
        while len(done) < len(wanted):
            assert time.monotonic() < deadline, f"oracle scan did not finish: {sorted(set(wanted) - done)}"
            for msg in consumer.consume(500, 1.0):
                tp = (msg.topic(), msg.partition())
                if msg.error():
                    # A range may end in an aborted transaction's records (its marker written after the
                    # next open transaction's first record): the position stays at the last record handed
                    # over, but the fetch reaching the range's end reports it as the partition's end.
                    if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= wanted[tp][1]:
                        done.add(tp)
                    continue
                start, end = wanted[tp]
                if start <= msg.offset() < end:
                    rows.append(((tp[0], tp[1], msg.offset(), digest(msg.value())), msg.value()))
            for tp, (_, end) in wanted.items():
                position = consumer.position([TopicPartition(tp[0], tp[1])])[0].offset
                if position >= end:
                    done.add(tp)
    finally:
        consumer.close()
    return rows


# -- one feed under test ----------------------------------------------------------------


GOOD, QUARANTINED = "good", "quarantined"


@dataclass
class Check:
    lost: list[Row]
    duplicated: list[Row]
    foreign: list[Row]
    misrouted: list[tuple[Row, str, str]]  # (record, where the feed's expectations put it, where it was published)
    checked: int


@dataclass
class FaultEnv:
    """A feed (string values; ``v-…`` is good, anything else is quarantined) over one topic; or, after
    :meth:`use_avro`, Avro values (good when the body decodes against its writer schema)."""

    kafka: KafkaTestCluster
    spark: Any
    tmp: Path
    name: str
    partitions: int = 3
    topic_config: Mapping[str, str] | None = None
    remote: str | None = None  # an s3:// prefix: state and output there (checkpoints then in PostgreSQL)
    feed: str = "faults"  # feeds of one test share its feeds folder and state dir; each has its own output
    iceberg: str | None = None  # publish into this Iceberg table (see :meth:`published_by_kind`)
    avro: AvroValues | None = None  # values in the Schema Registry wire format (see :meth:`use_avro`)
    topic: str = field(init=False)
    group: str = field(init=False)
    sent: int = field(init=False, default=0)
    run_ids: set[str] = field(init=False, default_factory=set)  # every run whose job or commit this env ran

    def __post_init__(self) -> None:
        self.feeds = self.tmp / "feeds"
        # Local paths, or Locations on the object store: both have `/`, `with_name` and `str`.
        self.root: Any = self.tmp / "state" if self.remote is None else Location.of(f"{self.remote}/state")
        out = "out" if self.feed == "faults" else f"out-{self.feed}"
        self.output: Any = self.tmp / out if self.remote is None else Location.of(f"{self.remote}/{out}")
        self.feeds.mkdir(parents=True, exist_ok=True)
        self.topic = self.kafka.new_topic(partitions=self.partitions, config=self.topic_config, prefix="fault")
        self.group = f"g-fault-{uuid.uuid4().hex[:8]}"
        self.write_feed()

    def feed_doc(self, **overrides: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "topics": [self.topic],
            "group": self.group,
            "records_per_task": 40,
            "deserialization": {"format": "avro" if self.avro else "string"},
            "output": str(self.output),
            **({"output_format": "iceberg", "iceberg": {"table": self.iceberg}} if self.iceberg else {}),
            "validation": {
                "on_bad_records": "quarantine",
                "quarantine_max_ratio": 0.5,
                # An Avro feed's bad records are those whose body does not decode.
                "expectations": [] if self.avro else [{"type": "expect_column_values_to_match_regex",
                                                       "kwargs": {"column": "value", "regex": "^v-"}}],
            },
        }  # fmt: skip
        doc.update(overrides)
        return doc

    def write_feed(self, **overrides: Any) -> None:
        (self.feeds / f"{self.feed}.yaml").write_text(yaml.safe_dump(self.feed_doc(**overrides)))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point the CLI, the pipeline and the job at this environment's feed files and state dir, no fault armed."""
        monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(self.feeds))
        monkeypatch.setenv("TIDEMARK_STATE_DIR", str(self.root))
        monkeypatch.delenv("TIDEMARK_FAULTS", raising=False)

    def use_iceberg(self, table: str) -> None:
        """Make the feed an Iceberg feed publishing into ``table`` (the catalog in the state dir)."""
        self.iceberg = table
        self.write_feed()

    def use_avro(self, registry_url: str) -> AvroValues:
        """Make the feed an Avro feed whose records are written through the registry at ``registry_url``."""
        self.avro = AvroValues(registry_url, self.topic)
        self.write_feed()
        return self.avro

    def produce_avro(
        self, count: int, poison: Iterable[int] = (), unknown: Iterable[int] = (), partition: int | None = None
    ) -> None:
        """``count`` records written by confluent-kafka's AvroSerializer, numbered on from the last; those in
        ``poison`` keep a valid prefix (magic byte, a registered id) before a body that does not decode, those in
        ``unknown`` a body framed with a schema id the registry does not know."""
        assert self.avro is not None, "produce_avro needs use_avro first"
        poison, unknown = set(poison), set(unknown)
        records = []
        for i in range(self.sent, self.sent + count):
            value = self.avro.serialize({"id": i, "name": f"v-{i}-{uuid.uuid4().hex[:6]}"})
            if i in poison:
                value = value[:5] + b"\xff\xff\xff\xff"
            elif i in unknown:
                value = b"\x00" + UNKNOWN_SCHEMA_ID.to_bytes(4, "big") + value[5:]
            target = partition if partition is not None else i % self.partitions
            records.append(Record(value=value, key=f"k{i}".encode(), partition=target))
        self.sent += count
        self.kafka.produce(self.topic, records)

    def produce(self, count: int, bad: Iterable[int] = (), partition: int | None = None) -> None:
        bad = set(bad)
        records = []
        for i in range(self.sent, self.sent + count):
            value = f"x-{i}" if i in bad else f"v-{i}-{uuid.uuid4().hex[:6]}"
            target = partition if partition is not None else i % self.partitions
            records.append(Record(value=value.encode(), key=f"k{i}".encode(), partition=target))
        self.sent += count
        self.kafka.produce(self.topic, records)

    def tps(self) -> list[tuple[str, int]]:
        return [(self.topic, p) for p in range(self.partitions)]

    def committed(self) -> dict[int, int | None]:
        """The group's committed offsets as Kafka answers a plain client (not through Tidemark's adapter)."""
        return {p: o for (_, p), o in group_offsets(self.kafka.connection, self.group, self.tps()).items()}

    def crash_after_table_commit(self, monkeypatch: pytest.MonkeyPatch) -> RunHandle:
        """Plan and stage a run of this Iceberg feed, then commit it crashing right after its table commit, before
        the run ledger records it shown: the run it leaves behind for the next one to settle."""
        from tidemark.faults import InjectedFault
        from tidemark.output.iceberg import IcebergPublisher
        from tidemark.runs.pipeline import commit_run, plan_run

        crashed = plan_run(self.feed, self.kafka.connection, root=self.root)
        self.in_process(crashed, self.kafka.connection)
        promote = IcebergPublisher.promote

        def promote_then_crash(publisher: IcebergPublisher, plan_id: str, run_id: str) -> Any:
            promote(publisher, plan_id, run_id)
            raise InjectedFault("after the table commit")

        with monkeypatch.context() as patched:
            patched.setattr(IcebergPublisher, "promote", promote_then_crash)
            with pytest.raises(InjectedFault):
                commit_run(crashed, self.kafka.connection, root=self.root)
        return crashed

    def in_process(self, handle: RunHandle, connection: KafkaConnection) -> dict[str, Any]:
        """The Spark job in this session: the same code ``spark-submit`` runs."""
        from tidemark.config.models import load_feed
        from tidemark.job.entry import upload_run_dir
        from tidemark.job.result import JobResult, write_result
        from tidemark.job.steps import run

        self.run_ids.add(handle.run_id)
        plan = handle.plan()
        result = JobResult(plan.plan_id, plan.feed)
        target = Location.of(handle.run_dir)
        # As the job's main(): a run dir on an object store is filled locally, then uploaded.
        run_dir = target.local_path() if target.is_local else Path(tempfile.mkdtemp(prefix="fault-run-"))

        def report() -> None:
            write_result(run_dir, result)
            if not target.is_local:
                assert upload_run_dir(run_dir, target), f"could not upload {run_dir} to {target}"

        try:
            run(self.spark, plan, load_feed(plan.feed), connection, run_dir, result=result, run_id=handle.run_id)
        except Exception as exc:
            result.error = str(exc)
            report()
            raise
        report()  # not on a crash: a crashed job writes nothing
        return result.to_dict()

    def run(
        self, mode: str = "scheduled", params: Mapping[str, Any] | None = None, master: str | None = None
    ) -> tuple[RunHandle, dict[str, Any], CommitOutcome]:
        """One run of the feed: the job in this session, or with ``master`` through ``spark-submit`` to that master."""
        handle, job, outcome = run_feed(
            self.feed, self.kafka.connection, mode=mode, params=params, root=self.root, master=master,
            job_runner=None if master else self.in_process,
        )  # fmt: skip
        self.run_ids.add(handle.run_id)
        return handle, job, outcome

    def run_until_idle(self, limit: int) -> list[CommitOutcome]:
        """Scheduled runs, each committing, until one has nothing to read; at most ``limit`` of them."""
        outcomes = []
        for _ in range(limit):
            handle, _, outcome = self.run()
            assert outcome.committed
            outcomes.append(outcome)
            if handle.records == 0:
                return outcomes
        raise AssertionError(f"the feed still had records after {limit} runs")

    def classifier(self) -> Callable[[bytes | None], str]:
        """Where the feed's expectations put a record: good, or quarantined (string values; regex rules only).

        Computed here from the feed file and the raw bytes, not by Tidemark: a value that is not
        UTF-8 fails to decode, a null passes every regex rule (as in GX), any other value must
        match every ``expect_column_values_to_match_regex`` on ``value``.
        """
        doc = yaml.safe_load((self.feeds / f"{self.feed}.yaml").read_text())
        rules = doc.get("validation", {}).get("expectations", [])
        unknown = [r["type"] for r in rules if r["type"] != "expect_column_values_to_match_regex"]
        assert not unknown, f"the fault oracle cannot classify records under {unknown}"
        patterns = [re.compile(r["kwargs"]["regex"]) for r in rules if r["kwargs"]["column"] == "value"]

        def kind(value: bytes | None) -> str:
            if value is None:
                return GOOD
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                return QUARANTINED
            return GOOD if all(p.search(text) for p in patterns) else QUARANTINED

        return kind

    def published(self, output: Any = None) -> Counter[Row]:
        """Good and quarantined records across every plan folder of ``output``."""
        rows: Counter[Row] = Counter()
        for kind in self.published_by_kind(output).values():
            rows.update(kind)
        return rows

    def published_by_kind(self, output: Any = None) -> dict[str, Counter[Row]]:
        """The published records of every plan folder of ``output``, good and quarantined apart.

        Locally every file under a plan folder counts (a rename publishes it whole); on an
        object store the files that plans' manifests list (the manifest is the commit point).
        A file under a plan's ``_quarantine/`` folder holds quarantined records. An Iceberg
        feed's good records are the table's rows; its quarantined ones are the files of the
        sibling ``<output>.quarantine/plan_id=<id>/`` folders of the plans the table's history
        holds (the catalog commit is the commit point: a folder whose plan never reached the
        table, is not published).
        """
        if self.iceberg is not None and output is None:
            assert self.avro is None, "the fault oracle reads Avro feeds' Parquet output only"
            return self._iceberg_rows()
        rows: dict[str, Counter[Row]] = {GOOD: Counter(), QUARANTINED: Counter()}
        for name, loc in self._published_files(output):
            kind = QUARANTINED if _quarantined(name) else GOOD
            _read_rows(name, loc, rows[kind], self.avro)
        return rows

    def _published_files(self, output: Any = None) -> list[tuple[str, Location]]:
        """The Parquet files published under ``output`` (see :meth:`published_by_kind`)."""
        where = Location.of(output if output is not None else self.output)
        if where.is_local:
            return [(str(p), Location.of(p)) for p in sorted(where.local_path().glob("plan_id=*/**/*.parquet"))]
        # The manifest is the commit point on an object store: read as JSON with pyarrow's own
        # filesystem, not through Tidemark's storage layer or its manifest reader.
        fs, base = store_fs(), where.url.split("://", 1)[1]
        files = []
        for info in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
            name = info.path.rsplit("/", 1)[-1]
            if info.type != pafs.FileType.Directory or not name.startswith("plan_id="):
                continue
            try:
                with fs.open_input_stream(f"{info.path}/_manifest.json") as fh:
                    manifest = json.loads(fh.read())
            except FileNotFoundError:
                continue
            files += [(f["path"], Location.of(f"s3://{info.path}/{f['path']}")) for f in manifest["files"]]
        return files

    def report_events(self, kind: str) -> list[dict[str, Any]]:
        """Every event of ``kind`` in the feed's run reports (what the Tidemark view lists), oldest run first."""
        found = []
        runs = Location.of(f"{self.root}/runs/{self.feed}")
        for run in sorted(runs.children(folders_only=True), key=lambda loc: loc.name) if runs.exists() else []:
            report = run / "report.json"
            if report.exists():
                found += [e for e in json.loads(report.read_text())["events"] if e.get("kind") == kind]
        return found

    def staged(self) -> Counter[Row]:
        """Records in pending publications (staged by a run's job, not shown), read from the files themselves."""
        rows: Counter[Row] = Counter()
        if self.iceberg is not None:
            pending = Location.of(f"{self.output}.pending")
            for run in pending.children(folders_only=True) if pending.exists() else []:
                for name, _ in run.files():
                    for path in json.loads((run / name).read_text())["paths"]:
                        _read_rows(path, Location.of(path), rows)
                    # The run's own quarantine (run_id=<run>/plan_id=<id>/), else the layout of plans staged before
                    kept = Location.of(f"{self.output}.quarantine")
                    quarantine = kept / f"run_id={run.name}" / name.removesuffix(".json")
                    if not quarantine.exists():
                        quarantine = kept / name.removesuffix(".json")
                    for part, _ in quarantine.files() if quarantine.exists() else []:
                        if part.endswith(".parquet"):
                            _read_rows(part, quarantine / part, rows)
            return rows
        where = Location.of(self.output)
        if where.is_local:
            for path in sorted(where.local_path().glob("_pending/*/plan_id=*/**/*.parquet")):
                _read_rows(str(path), Location.of(path), rows, self.avro)
            return rows
        fs, base = store_fs(), where.url.split("://", 1)[1]
        for info in fs.get_file_info(pafs.FileSelector(f"{base}/_pending", recursive=True, allow_not_found=True)):
            if info.path.endswith("/_manifest.json"):
                with fs.open_input_stream(info.path) as fh:
                    manifest = json.loads(fh.read())
                folder = info.path.rsplit("/", 1)[0].rsplit("/", 1)[-1]  # plan_id=<id>
                for f in manifest["files"]:
                    _read_rows(f["path"], Location.of(f"s3://{base}/{folder}/{f['path']}"), rows, self.avro)
        return rows

    def quarantine_reasons(self) -> dict[tuple[int, int], str]:
        """Each quarantined record's reason, by (partition, offset), from the published quarantine files."""
        reasons: dict[tuple[int, int], str] = {}
        for name, loc in self._published_files():
            if _quarantined(name):
                table = pq.read_table(loc.fs_path, filesystem=loc.fs, columns=["partition", "offset", REASON_COLUMN])
                reasons |= {(r["partition"], r["offset"]): r[REASON_COLUMN] for r in table.to_pylist()}
        return reasons

    def iceberg_table(self) -> Any:
        """The feed's Iceberg table through pyiceberg's own catalog (not Tidemark's publisher), or None."""
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError

        assert self.iceberg is not None
        uri = os.environ.get("TIDEMARK_ICEBERG_CATALOG_URI") or f"sqlite:///{self.root / 'iceberg_catalog.sqlite'}"
        properties = {"uri": uri.replace("postgresql://", "postgresql+psycopg://"),
                      "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}  # fmt: skip
        if os.environ.get("TIDEMARK_S3_ENDPOINT"):
            properties["s3.endpoint"] = os.environ["TIDEMARK_S3_ENDPOINT"]
        try:
            return load_catalog("tidemark", **properties).load_table(self.iceberg)  # the name is the catalog's key
        except NoSuchTableError:
            return None

    def _iceberg_rows(self) -> dict[str, Counter[Row]]:
        """The table's rows (:meth:`iceberg_table`); its quarantine folders of the plans some snapshot of the
        table's history names."""
        rows: dict[str, Counter[Row]] = {GOOD: Counter(), QUARANTINED: Counter()}
        table = self.iceberg_table()
        if table is None:
            return rows
        data = table.scan(selected_fields=("topic", "partition", "offset", "value")).to_arrow()
        columns = [data.column(c).to_pylist() for c in ("topic", "partition", "offset", "value")]
        rows[GOOD].update((str(t), int(p), int(o), digest(v)) for t, p, o, v in zip(*columns, strict=True))
        plans = {(s.summary.get("tidemark.plan-id"), s.summary.get("tidemark.run-id")) for s in table.snapshots()
                 if s.summary is not None and s.summary.get("tidemark.plan-id")}  # fmt: skip
        quarantine = Location.of(f"{self.output}.quarantine")
        for plan_id, run_id in sorted(plans, key=str):
            # A run's own folder (run_id=<run>/plan_id=<id>/), else one published outside any run or before
            own = quarantine / f"run_id={run_id}" / f"plan_id={plan_id}"
            folder = own if run_id and own.exists() else quarantine / f"plan_id={plan_id}"
            for name, _ in folder.files() if folder.exists() else []:
                if name.endswith(".parquet"):
                    _read_rows(name, folder / name, rows[QUARANTINED])
        return rows

    def expect(self, ranges: Mapping[tuple[str, int], tuple[int, int]]) -> tuple[Counter[Row], dict[Row, str]]:
        """The oracle's rows over ``ranges``, and where the feed's expectations put each (good or quarantined)."""
        scanned = scan(self.kafka.connection, ranges)
        if self.avro is not None:
            # A good Avro record is published as its decoded fields: compare those, not the framed bytes.
            kinds: dict[Row, str] = {}
            for (t, p, o, raw_digest), value in scanned:
                kind, decoded = self.avro.classify(value)
                kinds[(t, p, o, raw_digest if decoded is None else decoded)] = kind
            return Counter(kinds.keys()), kinds
        classify = self.classifier()
        return Counter(row for row, _ in scanned), {row: classify(value) for row, value in scanned}

    def check(self, test: str, starts: Mapping[int, int] | None = None, *, final: bool = True) -> Check:
        """Assert I1 and I2 (and I3 when ``final``) and add the counts to the scoreboard.

        ``starts``: where the group's history begins per partition (default 0); the oracle
        covers ``[start, committed)``. With ``final`` the published output must be exactly
        the oracle set; without, a run that crashed after the group's commit and before its
        publication was shown may have left committed records *staged* (the commit protocol's
        ``committed`` state, finished by the next run): those count when a pending publication
        holds them (:meth:`staged`), never lost or doubled ones.
        Every published record must also sit where the feed's expectations put it: good
        ones in the plan's folder, bad ones in its quarantine (:meth:`classifier`).
        """
        committed = self.committed()
        ranges = {}
        for p, c in committed.items():
            start = (starts or {}).get(p, 0)
            ranges[(self.topic, p)] = (start, start if c is None else c)
        expected, kinds = self.expect(ranges)
        by_kind = self.published_by_kind()
        got = by_kind[GOOD] + by_kind[QUARANTINED]

        def inside(r: Row) -> bool:
            return ranges[(r[0], r[1])][0] <= r[2] < ranges[(r[0], r[1])][1]

        in_range = Counter({r: n for r, n in got.items() if inside(r)})
        if not final:  # committed, staged, not yet shown: the next run shows them
            pending = self.staged()
            in_range += Counter({r: 1 for r in (expected - in_range) if r in pending})
        misrouted = sorted(
            (r, kinds[r], kind) for kind, rows in by_kind.items() for r in rows if r in kinds and kinds[r] != kind
        )
        result = Check(
            lost=sorted(expected - in_range),
            duplicated=sorted(r for r, n in got.items() if n > 1),
            foreign=sorted(in_range - expected),
            misrouted=misrouted,
            checked=len(expected),
        )
        tally = SCOREBOARD.setdefault(test, Tally())
        tally.compared(expected, kinds)
        tally.records_lost += len(result.lost)
        tally.records_duplicated += sum(got[r] - 1 for r in result.duplicated)
        tally.records_misrouted += len(result.misrouted)
        tally.partitions = max(tally.partitions, sum(1 for start, end in ranges.values() if end > start))
        tally.runs = max(tally.runs, len(self.run_ids))
        assert not result.lost, f"I1/I2: committed but not published: {result.lost[:5]}"
        assert not result.duplicated, f"I2: published more than once: {result.duplicated[:5]}"
        assert not result.foreign, f"I2: published rows Kafka does not hold there: {result.foreign[:5]}"
        assert not result.misrouted, (
            f"I1: published where the feed's expectations do not put it ((record, expected, published as)): "
            f"{result.misrouted[:5]}"
        )
        if final:
            beyond = sorted(r for r in got if r[2] >= ranges[(r[0], r[1])][1])
            assert not beyond, f"I3: published beyond the committed offsets: {beyond[:5]}"
            self.verify_clean()
        return result

    def verify_clean(self) -> None:
        """``tidemark verify`` finds nothing but files a crashed attempt left (an upload before its commit, a staging
        folder of a plan never attempted again: maintenance's and the next attempt's to remove, owned by nothing
        meanwhile). Local outputs only: on the object store the same check would re-read every file through s3proxy,
        which the scenarios on S3 do not need to prove again."""
        if self.remote is not None:
            return
        from tidemark.runs.verify import verify_feed

        with pytest.MonkeyPatch.context() as env:  # the scenario's environment, which a test may have undone by now
            self.install(env)
            report = verify_feed(self.feed, connection=self.kafka.connection, root=self.root)
        found = [f.message for f in report.findings if f.kind != "unowned_file"]
        assert not found, f"tidemark verify: {found[:5]}"


def _quarantined(name: str) -> bool:
    return f"/{QUARANTINE_DIR}/" in f"/{name}"


def _read_rows(name: str, loc: Location, into: Counter[Row], avro: AvroValues | None = None) -> None:
    """Count the records of one published Parquet file (its topic from a ``topic=`` folder where it has no column)."""
    topic = next((part[len("topic=") :] for part in name.split("/") if part.startswith("topic=")), None)
    table = pq.read_table(loc.fs_path, filesystem=loc.fs)
    names = table.column_names
    topics = table.column("topic").to_pylist() if "topic" in names else [topic] * table.num_rows
    if avro is None:
        # Bytes as stored: a quarantined record's value need not be valid UTF-8.
        digests = [digest(v) for v in table.column("value").cast(pa.binary()).to_pylist()]
    elif RAW_VALUE_COLUMN in names:  # an Avro feed's quarantine keeps the raw value
        digests = [digest(v) for v in table.column(RAW_VALUE_COLUMN).to_pylist()]
    else:
        digests = [fields_digest(r) for r in table.select(list(AVRO_FIELDS)).to_pylist()]
    for t, p, o, d in zip(topics, table.column("partition").to_pylist(),
                          table.column("offset").to_pylist(), digests, strict=True):  # fmt: skip
        into[(str(t), int(p), int(o), d)] += 1


# -- Avro values ------------------------------------------------------------------------

AVRO_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "FaultRecord", "namespace": "tidemark.faults",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}  # fmt: skip
AVRO_FIELDS = tuple(str(f["name"]) for f in AVRO_SCHEMA["fields"])
UNKNOWN_SCHEMA_ID = 2_000_000_000  # the registry's ids are small content ids


def fields_digest(record: Mapping[str, Any]) -> str:
    """A decoded record's digest: its fields as canonical JSON (what the oracle and the output both have)."""
    return digest(json.dumps({f: record[f] for f in AVRO_FIELDS}, sort_keys=True))


@dataclass
class AvroValues:
    """A topic's values written with :data:`AVRO_SCHEMA` through a registry, and read back independently.

    Records are written by confluent-kafka's ``AvroSerializer`` (subject ``<topic>-value``);
    :meth:`classify` decodes a raw value with fastavro against the writer schema the registry
    holds for its id, not with anything of Tidemark's.
    """

    registry_url: str
    topic: str

    def __post_init__(self) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        self.client = SchemaRegistryClient({"url": self.registry_url})
        self._serializer = AvroSerializer(self.client, json.dumps(AVRO_SCHEMA), conf={"auto.register.schemas": True})
        self._context = SerializationContext(self.topic, MessageField.VALUE)

    def serialize(self, record: Mapping[str, Any]) -> bytes:
        return bytes(self._serializer(dict(record), self._context))

    def classify(self, value: bytes | None) -> tuple[str, str | None]:
        """Good (with :func:`fields_digest`) or quarantined (None: the raw bytes are what is published).

        An id the registry does not know raises: such a record fails the run, it is never published.
        """
        import io

        import fastavro

        if value is None:
            return QUARANTINED, None  # a tombstone has no fields to publish
        assert len(value) >= 5 and value[0] == 0, f"not in the wire format: {value[:8]!r}"
        writer = self.client.get_schema(int.from_bytes(value[1:5], "big"))
        parsed = fastavro.parse_schema(json.loads(writer.schema_str))
        try:
            record = fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed, fastavro.parse_schema(AVRO_SCHEMA))
        except (IndexError, EOFError, ValueError, UnicodeDecodeError):  # fastavro's errors for a truncated body
            return QUARANTINED, None
        assert isinstance(record, dict)
        return GOOD, fields_digest(record)


def assert_names(message: str, *fragments: str) -> None:
    """I4: an error names what is involved (topic, partition, offsets) and says what to do."""
    missing = [f for f in fragments if not re.search(f, message)]
    assert not missing, f"I4: error does not name {missing}: {message}"


def write_scoreboard(board: Mapping[str, Tally] = SCOREBOARD, path: Path | None = None) -> dict[str, Any]:
    """Write ``board``'s totals and per-test tallies to ``path`` (default: this process's own file)."""
    totals = Tally()
    for tally in board.values():
        for name, value in vars(tally).items():
            setattr(totals, name, getattr(totals, name) + value)
    doc = {
        "scenarios_run": len(board),
        **vars(totals),
        "by_test": {name: vars(t) for name, t in sorted(board.items())},
    }
    (path or scoreboard_path()).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def scoreboard_path() -> Path:
    """Where this process writes its count: under xdist each worker a file of its own, since the
    fault suite and other oracle-checked tests (secured runs, S3 publishers) run on different
    workers; the controller merges them into ``LAST_RUN`` (:func:`merge_scoreboards`)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return LAST_RUN.with_name(f"last-run.{worker}.json") if worker else LAST_RUN


def merge_scoreboards(since: float) -> dict[str, Any] | None:
    """Merge the workers' files written after ``since`` into ``LAST_RUN``; None if there are none."""
    parts = [p for p in LAST_RUN.parent.glob("last-run.gw*.json") if p.stat().st_mtime >= since]
    if not parts:
        return None
    board = {name: Tally(**t) for p in parts for name, t in json.loads(p.read_text())["by_test"].items()}
    for p in parts:
        p.unlink()
    return write_scoreboard(board, LAST_RUN)
