"""Differential, property-based, end to end: generated Avro schemas through whole runs against fastavro.

Hypothesis generates a writer schema and, most often, a reader that evolves it (Avro's
promotions int → long/float/double, long → float/double, float → double, string ↔ bytes;
enum symbols reordered and added; a field added with a default); both are registered in the real registry
(the ``registry`` fixture) as versions of the topic's subject, so the reader is the
subject's latest. A seeded generator writes many records of each (edge values: NaN, ±inf,
the extremes of every integer and temporal type, empty and huge strings), encoded by
fastavro in the Schema Registry wire format and produced to the real cluster. The feed
runs twice with the read tasks allowed (:mod:`tidemark.spark.arrow_avro`): the first run
reads only bodies fastavro decodes, so a flat schema must be staged by the read tasks;
the second reads corrupted bodies too (a byte left over, a byte missing, the first union
branch flipped, garbage, every boolean of a record written as a byte other than 0 or 1,
``timestamp-millis`` values whose microseconds overflow a long), on which the read tasks
give way to Spark's path (``from_avro``). ``make test-differential``
adds a third feed over the same topic with Spark's path alone.

The oracle never runs Tidemark's code: a ``read_committed`` scan of the topic, each body's
writer schema fetched by id with confluent-kafka's registry client, decoded by fastavro and
resolved to the subject's latest version, read to its last byte, every boolean the byte 0
or 1 and every union index one of the union's (the spec's rules, which fastavro does not
apply: it reads any boolean byte but 0 as true, and a union index -1 as the last branch;
:func:`tests.support.differential.avro_within_spec`). A record is published with
fastavro's values exactly when fastavro decodes it so; every other record is quarantined.

``make test`` runs :data:`EXAMPLES` (1, the simplest schema Hypothesis draws, shaped so
that it is every flat kind, nullable and not, each promotion and an added field);
``TIDEMARK_DIFF_E2E_EXAMPLES`` sets more (``make differential``, ``make test-differential``).
The counts are printed at the end of the module.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import os
import random
import struct
import sys
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import env_of
from tests.integration.job.test_registry_formats import RegistryEnv
from tests.support.differential import (
    avro_with_boolean_bytes,
    avro_within_spec,
    comparable,
    report_counts,
)
from tidemark.spark.arrow_avro import SWITCH_ENV
from tidemark.spark.wire import header
from tidemark.staged import STAGED_BY_READ_TASKS

pytestmark = [pytest.mark.integration, pytest.mark.spark]

EXAMPLES = int(os.environ.get("TIDEMARK_DIFF_E2E_EXAMPLES", "1"))
SPARK_FEED = EXAMPLES > 1  # the third feed (Spark's path over the whole topic) in the longer runs only
RECORDS = 200  # good records per writer and run
COUNTS: Counter[str] = Counter()

FIRST, LAST = dt.datetime(1, 1, 1, tzinfo=dt.UTC), dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MILLIS = ((FIRST - EPOCH) // dt.timedelta(milliseconds=1), (LAST - EPOCH) // dt.timedelta(milliseconds=1))
MICROS = ((FIRST - EPOCH) // dt.timedelta(microseconds=1), (LAST - EPOCH) // dt.timedelta(microseconds=1))
DAYS = ((dt.date(1, 1, 1) - dt.date(1970, 1, 1)).days, (dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days)
# timestamp-millis values whose microseconds overflow a long (epoch nanoseconds in a millis field, say)
OVERFLOWING_MILLIS = [1_764_115_200_000_000_100, 2**63 - 1, -(2**63), 2**63 // 1000 + 1, -(2**63 // 1000) - 1]

FLAT = ["boolean", "int", "long", "float", "double", "string", "bytes", "enum", "date", "ts-millis", "ts-micros"]
SPARK_ONLY = ["decimal", "record", "array", "map"]
# Avro's promotions, each writer type's first the one Hypothesis's simplest draw takes.
PROMOTIONS = {"int": ["long", "float", "double"], "long": ["double", "float"], "float": ["double"],
              "string": ["bytes"], "bytes": ["string"]}  # fmt: skip
# A reader's enum: its symbols reordered with one added (Avro resolves symbols by name), the same, or one added.
READER_SYMBOLS = [["C", "A", "B", "D"], ["A", "B", "C"], ["A", "B", "C", "D"]]


def _avro(kind: str, n: int) -> Any:
    """The Avro type of a field of ``kind``, its named types numbered ``n``."""
    simple: dict[str, Any] = {
        "enum": {"type": "enum", "name": f"E{n}", "symbols": ["A", "B", "C"]},
        "date": {"type": "int", "logicalType": "date"},
        "ts-millis": {"type": "long", "logicalType": "timestamp-millis"},
        "ts-micros": {"type": "long", "logicalType": "timestamp-micros"},
        "decimal": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3},
        "record": {"type": "record", "name": f"R{n}", "fields": [
            {"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string"]},
            {"name": "c", "type": {"type": "array", "items": {"type": "long", "logicalType": "timestamp-micros"}}},
            {"name": "d", "type": ["null", "boolean"]}]},
        "array": {"type": "array", "items": "double"},
        "map": {"type": "map", "values": ["null", "long"]},
    }  # fmt: skip
    return simple.get(kind, kind)


@st.composite
def schema_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A writer record and its reader (the writer's, or an evolution of it).

    Each choice is drawn so that Hypothesis's simplest draw is the richest flat case: every
    flat kind, nullable and not, each promotion taken, a field added; ``make test`` runs it.
    """
    kinds = list(FLAT)
    dropped = draw(st.sets(st.sampled_from(FLAT), max_size=len(FLAT) - 1))
    kinds = [k for k in draw(st.permutations(kinds)) if k not in dropped]
    kinds += draw(st.lists(st.sampled_from(SPARK_ONLY), max_size=3))
    fields, reader_fields = [], []
    for n, kind in enumerate(kinds):
        avro = _avro(kind, n)
        nullable = draw(st.booleans()) != (n % 2 == 0)
        field = {"name": f"f{n}", "type": ["null", avro] if nullable else avro}
        fields.append(field)
        promotions = PROMOTIONS.get(avro, []) if isinstance(avro, str) else []
        if promotions and not draw(st.booleans()):
            promoted = draw(st.sampled_from(promotions))
            reader_fields.append({**field, "type": ["null", promoted] if nullable else promoted})
        elif kind == "enum":
            symbols = {**avro, "symbols": draw(st.sampled_from(READER_SYMBOLS))}
            reader_fields.append({**field, "type": ["null", symbols] if nullable else symbols})
        else:
            reader_fields.append(field)
    if not draw(st.booleans()):
        reader_fields.append({"name": "added", "type": ["long", "null"], "default": 7})
    writer = {"type": "record", "name": "Row", "namespace": "diff", "fields": fields}
    return writer, {**writer, "fields": reader_fields}


def _float32(rng: random.Random) -> float:
    return float(struct.unpack("<f", struct.pack("<f", rng.uniform(-3e38, 3e38)))[0])


def _value(t: Any, rng: random.Random) -> Any:
    """A random value of Avro type ``t``: an edge value a third of the time."""
    edge = rng.random() < 1 / 3
    if isinstance(t, list):
        return None if rng.random() < 0.2 else _value(next(b for b in t if b != "null"), rng)
    kind = t if isinstance(t, str) else t.get("logicalType") or t["type"]
    if kind in ("int", "long", "date", "timestamp-millis", "timestamp-micros"):
        low, high = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1), "date": DAYS,
                     "timestamp-millis": MILLIS, "timestamp-micros": MICROS}[kind]  # fmt: skip
        return rng.choice([low, high, 0, -1, 1]) if edge else rng.randint(low, high)
    if kind == "float":
        return rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0, 3.4028234663852886e38, 1.401298464324817e-45]) \
            if edge else _float32(rng)  # fmt: skip
    if kind == "double":
        wild = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        return rng.choice([math.nan, math.inf, -math.inf, -0.0, sys.float_info.max, 5e-324]) if edge else wild
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "string":
        if edge:
            return rng.choice(["", "é€😀" * 3000, "\x00"])
        return "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0xA0, 0xD7FF), rng.randint(0xE000, 0x10FFFF)]))
                       for _ in range(rng.randint(0, 20)))  # fmt: skip
    if kind == "bytes":
        return rng.choice([b"", b"\x00" * 1000]) if edge else rng.randbytes(rng.randint(0, 40))
    if kind == "decimal":
        digits = rng.choice([10**12 - 1, -(10**12) + 1, 0]) if edge else rng.randint(-(10**12) + 1, 10**12 - 1)
        return Decimal(digits).scaleb(-3)
    if kind == "enum":
        return rng.choice(t["symbols"])
    if kind == "record":
        return {f["name"]: _value(f["type"], rng) for f in t["fields"]}
    if kind == "array":
        return [_value(t["items"], rng) for _ in range(rng.randint(0, 4))]
    if kind == "map":
        return {f"k{rng.randint(0, 99)}": _value(t["values"], rng) for _ in range(rng.randint(0, 3))}
    raise AssertionError(f"no values for {t}")


def _encoded(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return header(schema_id) + out.getvalue()


def _decodes(writer: dict[str, Any], reader: dict[str, Any], value: bytes) -> Any:
    """fastavro's record for ``value``'s body resolved to ``reader``, or None (it fails, leaves bytes over, or a
    boolean is a byte other than 0 or 1)."""
    import fastavro

    body = io.BytesIO(value[5:])
    try:
        doc = fastavro.schemaless_reader(body, fastavro.parse_schema(writer), fastavro.parse_schema(reader))
    except Exception:  # noqa: BLE001 - any failure of the reference decoder: a body that does not decode
        return None
    return doc if body.tell() == len(value) - 5 and avro_within_spec(writer, value[5:]) else None


def _corrupted(writer: dict[str, Any], good: bytes, rng: random.Random) -> list[bytes]:
    """Bodies as producers' bugs leave them: a byte left over, a byte missing, the first field's union branch flipped
    (so that bytes remain, or too few), bytes that are no record."""
    bad = [good + b"\x00", good[:-1] if len(good) > 6 else good + b"\x80", good[:5] + rng.randbytes(3)]
    if isinstance(writer["fields"][0]["type"], list):
        bad.append(good[:5] + bytes([good[5] ^ 0x02]) + good[6:])  # null (0) <-> the value's branch (zigzag 1 = 2)
    return bad


def _overflowing(writer: dict[str, Any], good: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
    """``good`` with a ``timestamp-millis`` field set to a value whose microseconds overflow a long, if it has one."""
    for f in writer["fields"]:
        types = f["type"] if isinstance(f["type"], list) else [f["type"]]
        if any(isinstance(t, dict) and t.get("logicalType") == "timestamp-millis" for t in types):
            return {**good, f["name"]: rng.choice(OVERFLOWING_MILLIS)}
    return None


def _as_compared(reader: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """``doc``'s reader fields, maps (fastavro's dicts, Parquet's lists of pairs) as (key, value) pairs, floats as
    the 32-bit floats they are."""

    def maps(t: Any, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(t, list):
            return maps(next(b for b in t if b != "null"), v)
        if isinstance(t, dict) and t.get("type") == "map":
            return [(k, maps(t["values"], x)) for k, x in (v.items() if isinstance(v, dict) else v)]
        if isinstance(t, dict) and t.get("type") == "record":
            return {f["name"]: maps(f["type"], v[f["name"]]) for f in t["fields"]}
        if isinstance(t, dict) and t.get("type") == "array":
            return [maps(t["items"], x) for x in v]
        if t == "float":  # a long or int promoted to float: fastavro keeps Python's double, the column a float
            return struct.unpack("<f", struct.pack("<f", v))[0]
        return v

    return comparable({f["name"]: maps(f["type"], doc[f["name"]]) for f in reader["fields"]})


def _flat(t: Any) -> bool:
    """Whether a field of type ``t`` is one the read tasks stage (a flat kind, alone or in a union with null)."""
    if isinstance(t, list):
        return all(_flat(b) for b in t if b != "null")
    return isinstance(t, str) or t.get("type") in ("enum", "int", "long")


class DiffEnv(RegistryEnv):
    # Many of the records are bad on purpose: none may fail the run. The data source reads, so the read tasks may stage.
    feed_options: ClassVar[dict[str, Any]] = {
        "driver_read_max_records": 0,
        "validation": {"on_bad_records": "quarantine", "quarantine_max_ratio": 1.0, "expectations": []},
    }

    def oracle(self) -> dict[tuple[int, int], dict[str, Any] | None]:
        """Every record of the topic, read_committed: fastavro's record, resolved to the subject's latest version,
        read to the body's last byte and every boolean the byte 0 or 1, or None."""
        import fastavro

        reader = fastavro.parse_schema(json.loads(self.sr.get_latest_version(f"{self.topic}-value").schema.schema_str))
        writers: dict[int, tuple[Any, Any]] = {}  # schema id -> (its JSON, parsed)

        def decode(value: bytes) -> dict[str, Any] | None:
            if len(value) < 5 or value[0] != 0:
                return None
            sid = int.from_bytes(value[1:5], "big")
            if sid not in writers:
                doc = json.loads(self.sr.get_schema(sid).schema_str)
                writers[sid] = (doc, fastavro.parse_schema(doc))
            body = io.BytesIO(value[5:])
            try:
                doc = fastavro.schemaless_reader(body, writers[sid][1], reader)
            except Exception:  # noqa: BLE001 - any failure of the reference decoder: a body that does not decode
                return None
            whole = body.tell() == len(value) - 5
            return doc if whole and avro_within_spec(writers[sid][0], value[5:]) else None

        return self.scan_with(decode)

    def quarantine_reasons(self) -> dict[tuple[int, int], str]:
        """Each quarantined record's reason. Only these columns are read: a bad record's decoded columns may hold
        strings that are not UTF-8 (why it is there), which pyarrow does not turn into Python strings."""
        import pyarrow.dataset as ds

        found = list(self.output.glob("plan_id=*/_quarantine"))
        if not found:
            return {}
        rows = [
            r
            for folder in found
            for r in ds.dataset(str(folder), format="parquet", partitioning="hive", ignore_prefixes=["."])
            .to_table(columns=["partition", "offset", "_reason"])
            .to_pylist()
        ]
        return {(r["partition"], r["offset"]): r["_reason"] for r in rows}

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {p.parent.name: json.loads(p.read_text()) for p in self.root.glob("runs/orders/*/job.json")}


def _check_run_outcome(env: DiffEnv, reader: dict[str, Any]) -> tuple[int, int]:
    """The feed's whole output against the oracle: fastavro's records published with its values, the others
    quarantined, the group at the end of the topic. The numbers of records published and quarantined."""
    expected = env.oracle()
    published = env.published()
    quarantined = env.quarantine_reasons()
    good = {k for k, v in expected.items() if v is not None}
    assert published.keys() == good, sorted(published.keys() ^ good)[:10]
    assert quarantined.keys() == expected.keys() - good, sorted(quarantined.keys() ^ (expected.keys() - good))[:10]
    assert all(why.startswith("decode_error: value") for why in quarantined.values()), set(quarantined.values())
    names = [f["name"] for f in reader["fields"]]
    wrong = [
        (k, {n: published[k][n] for n in names}, expected[k])
        for k in sorted(good)
        if _as_compared(reader, {n: published[k][n] for n in names}) != _as_compared(reader, expected[k])  # type: ignore[arg-type]
    ]
    assert wrong == [], wrong[:3]
    ends = Counter(p for p, _ in expected)
    assert env.committed() == {0: ends[0] or None, 1: ends[1] or None}
    return len(good), len(quarantined)


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    report_counts(request, "Avro end to end", EXAMPLES, COUNTS)


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(pair=schema_pairs(), rng=st.randoms(use_true_random=True))
def test_differential_avro_generated_schemas_end_to_end_on_both_paths_publish_what_fastavro_decodes(
    pair: tuple[dict[str, Any], dict[str, Any]],
    rng: random.Random,
    kafka: KafkaTestCluster,
    registry: str,
    spark: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from confluent_kafka.schema_registry import Schema

    writer, reader = pair
    flat = all(_flat(f["type"]) for f in writer["fields"])
    with pytest.MonkeyPatch.context() as monkeypatch:
        env = env_of(DiffEnv, kafka, registry, tmp_path_factory.mktemp("avro-diff"), spark, monkeypatch)
        subject = f"{env.topic}-value"
        writer_id = env.sr.register_schema(subject, Schema(json.dumps(writer), "AVRO"))
        reader_id = env.sr.register_schema(subject, Schema(json.dumps(reader), "AVRO"))
        env.write_feed()
        COUNTS["schemas"] += 1
        COUNTS["evolved schemas"] += writer != reader

        def produce(values: list[bytes]) -> None:
            for partition in range(2):
                env.produce(values[partition::2], partition)

        refused: list[bytes] = []  # generated values fastavro does not resolve (bytes that are not text read as string)

        def good(n: int) -> list[bytes]:
            """``n`` records of the writer and a quarter as many of the reader, all of them bodies fastavro decodes;
            the others go to ``refused``, for the second run."""
            values = [_encoded(writer_id, writer, _value(writer, rng)) for _ in range(n)]
            if reader_id != writer_id:  # producers that moved to the reader's version
                values += [_encoded(reader_id, reader, _value(reader, rng)) for _ in range(n // 4)]
            schemas = {writer_id: writer, reader_id: reader}
            refused.extend(v for v in values if _decodes(schemas[int.from_bytes(v[1:5], "big")], reader, v) is None)
            return [v for v in values if v not in refused]

        # Run 1: only bodies fastavro decodes. A flat schema's records are the read tasks' to stage.
        produce(good(RECORDS))
        env.run()
        (first,) = env.jobs().values()
        if flat:
            assert first["staged_by"] == STAGED_BY_READ_TASKS, first
        COUNTS[f"first runs staged by {first['staged_by']}"] += 1
        _check_run_outcome(env, reader)

        # Run 2: corrupted bodies and values no column holds among good ones; the read tasks give way to Spark.
        records = [_value(writer, rng) for _ in range(RECORDS // 4)]
        bad = [b for r in records[:4] for b in _corrupted(writer, _encoded(writer_id, writer, r), rng)]
        overflowing = [o for r in records[4:8] if (o := _overflowing(writer, r, rng)) is not None]
        bad += [_encoded(writer_id, writer, r) for r in overflowing]
        booleans = [  # every boolean of a record (any depth) written as a byte other than 0 or 1, where it has one
            header(writer_id) + avro_with_boolean_bytes(writer, r, rng.randint(2, 255))
            for r in records[8:12]
            if avro_with_boolean_bytes(writer, r, 0) != avro_with_boolean_bytes(writer, r, 1)
        ]
        bad += booleans
        values = good(RECORDS // 2) + bad + refused
        rng.shuffle(values)
        produce(values)
        env.run()
        (second,) = [j for run, j in env.jobs().items() if j != first]
        COUNTS[f"second runs staged by {second['staged_by']}"] += 1
        published, quarantined = _check_run_outcome(env, reader)
        COUNTS["records published as fastavro decodes them (read-task feed)"] += published
        COUNTS["records quarantined as fastavro refuses them (read-task feed)"] += quarantined
        COUNTS["corrupted bodies"] += len(bad) - len(overflowing) - len(booleans)
        COUNTS["bodies with a boolean byte other than 0 or 1"] += len(booleans)
        COUNTS["generated values fastavro refuses (bytes read as string)"] += len(refused)
        COUNTS["overflowing timestamp-millis records"] += len(overflowing)

        if SPARK_FEED:  # Spark's path alone over the whole topic: another group, another output
            monkeypatch.setenv(SWITCH_ENV, "0")
            env.group, env.output = env.group + "-spark", env.output.with_name("out-spark")
            env.root = env.root.with_name("state-spark")
            monkeypatch.setenv("TIDEMARK_STATE_DIR", str(env.root))
            env.write_feed()
            env.run()
            (third,) = env.jobs().values()
            assert third["staged_by"] == "spark"
            published, quarantined = _check_run_outcome(env, reader)
            COUNTS["records published as fastavro decodes them (Spark-only feed)"] += published
            COUNTS["records quarantined as fastavro refuses them (Spark-only feed)"] += quarantined


def test_the_oracle_refuses_what_it_should() -> None:
    """The oracle's own check, without Kafka: fastavro reads a trailing byte and a missing byte as no record, and an
    overflowing ``timestamp-millis`` as no value."""
    import fastavro

    writer = {"type": "record", "name": "R", "fields": [{"name": "at", "type": _avro("ts-millis", 0)},
                                                         {"name": "s", "type": ["null", "string"]}]}  # fmt: skip
    parsed = fastavro.parse_schema(writer)

    def reads(value: bytes) -> bool:
        body = io.BytesIO(value[5:])
        try:
            fastavro.schemaless_reader(body, parsed, parsed)
        except Exception:  # noqa: BLE001
            return False
        return body.tell() == len(value) - 5

    good = _encoded(1, writer, {"at": 0, "s": "x"})
    assert reads(good)
    left_over, missing, *_ = _corrupted(writer, good, random.Random(0))
    assert not reads(left_over) and not reads(missing)
    assert not reads(_encoded(1, writer, {"at": OVERFLOWING_MILLIS[0], "s": None}))


def test_the_oracle_and_the_generator_take_booleans_as_the_spec_says() -> None:
    """Without Kafka: the generator writes a boolean as the byte asked for, at any depth (the byte 1 as fastavro
    writes true), and the oracle refuses a byte other than 0 or 1 that fastavro reads as true."""
    import fastavro

    writer = {"type": "record", "name": "W", "fields": [{"name": "r", "type": _avro("record", 0)},
                                                         {"name": "b", "type": "boolean"}]}  # fmt: skip
    record = {"r": {"a": 1, "b": None, "c": [], "d": True}, "b": True}
    good = _encoded(1, writer, record)
    assert good == header(1) + avro_with_boolean_bytes(writer, record, 1)
    assert _decodes(writer, writer, good) == record
    bad = header(1) + avro_with_boolean_bytes(writer, record, 2)
    assert bad != good and fastavro.schemaless_reader(io.BytesIO(bad[5:]), fastavro.parse_schema(writer)) == record
    assert _decodes(writer, writer, bad) is None


def test_the_oracle_refuses_a_negative_union_index() -> None:
    """Without Kafka: fastavro reads a union index -1 (the byte 1) as the union's last branch, Python's list[-1]; the
    spec allows only the union's indexes, and Java's reader refuses it. Found by the end-to-end differential: a union
    branch flipped in the first field shifted a byte 1 onto the next field's union index."""
    import fastavro

    writer = {"type": "record", "name": "U", "fields": [{"name": "u", "type": ["null", "long"]}]}
    bad = header(1) + b"\x01\x02"  # index -1, then the long 1
    assert fastavro.schemaless_reader(io.BytesIO(bad[5:]), fastavro.parse_schema(writer)) == {"u": 1}
    assert _decodes(writer, writer, bad) is None
    assert _decodes(writer, writer, header(1) + b"\x02\x02") == {"u": 1}


TEXT_WRITER = {"type": "record", "name": "Text", "namespace": "diff",
               "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"},
                          {"name": "blob", "type": "bytes"}]}  # fmt: skip
TEXT_READER = {**TEXT_WRITER, "fields": [*TEXT_WRITER["fields"][:2], {"name": "blob", "type": "string"}]}


@pytest.mark.parametrize("path", ["read tasks first", "spark"])
def test_text_whose_bytes_are_not_utf8_is_quarantined_on_both_paths_never_published(
    kafka: KafkaTestCluster, registry: str, spark: Any, tmp_path_factory: pytest.TempPathFactory, path: str
) -> None:
    """A ``string`` whose bytes are not UTF-8 (a producer's bug), and ``bytes`` that are not UTF-8 read as ``string``
    (Avro's promotion): fastavro decodes neither; Spark's ``from_avro`` gave both as strings that are not text."""
    from confluent_kafka.schema_registry import Schema

    def zigzag(n: int) -> bytes:
        n = (n << 1) ^ (n >> 63)
        out = b""
        while n >= 0x80:
            out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
        return out + bytes([n])

    def body(schema_id: int, i: int, name: bytes, blob: bytes) -> bytes:
        return header(schema_id) + zigzag(i) + zigzag(len(name)) + name + zigzag(len(blob)) + blob

    with pytest.MonkeyPatch.context() as monkeypatch:
        env = env_of(DiffEnv, kafka, registry, tmp_path_factory.mktemp("avro-text"), spark, monkeypatch)
        if path == "spark":
            monkeypatch.setenv(SWITCH_ENV, "0")
        subject = f"{env.topic}-value"
        writer_id = env.sr.register_schema(subject, Schema(json.dumps(TEXT_WRITER), "AVRO"))
        env.sr.register_schema(subject, Schema(json.dumps(TEXT_READER), "AVRO"))
        good = [body(writer_id, i, f"n{i}é".encode(), f"b{i}".encode()) for i in range(20)]
        bad = [body(writer_id, 100, b"\xff\xfe", b"ok"), body(writer_id, 101, b"ok", b"\xc3\x28"),
               body(writer_id, 102, "é".encode()[:1], b"")]  # fmt: skip
        env.produce(good[:10] + bad, 0)
        env.produce(good[10:], 1)

        env.run()

        _check_run_outcome(env, TEXT_READER)
        assert len(env.published()) == 20
        assert set(env.quarantine_reasons().values()) == {
            "decode_error: value does not decode against its Avro writer schema"
        }
