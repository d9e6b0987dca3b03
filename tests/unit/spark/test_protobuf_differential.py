"""Differential, property-based: Tidemark's Protobuf decoding against the protobuf runtime's own, without Kafka.

Hypothesis generates a writer message (scalars of every kind, an enum, a nested message,
``google.protobuf.Timestamp``, repeated fields, maps with scalar and message values, a
oneof, ``optional`` scalars) and a reader: the writer's, or an evolution the Protobuf
compatibility rules allow (fields renamed, removed, added; a type changed within its wire
kind: int32 ↔ int64 ↔ uint32 ↔ uint64 ↔ bool ↔ enum, sint32 ↔ sint64, fixed32 ↔ sfixed32,
fixed64 ↔ sfixed64, string ↔ bytes; a field moved into a oneof; enum values added or
removed; the nested message evolved too). Some readers change a field's wire kind instead,
or read a message as a ``Timestamp``: those pairs must be refused before anything is read
(:func:`tidemark.spark.protobuf._incompatibility`). A seeded generator fills many messages
per schema with edge values (NaN, ±inf, each integer kind's extremes, Timestamps at and
beyond years 1 and 9999, empty and huge strings, unknown enum numbers); the bodies are
framed in the Schema Registry wire format, and corrupted ones are added (a byte left over,
a byte missing, garbage, message indexes naming another message).

The oracle is the runtime: each body parsed by the reader's class, built with
``message_factory`` from a ``descriptor_pool`` of the reader's file, its values read off
the message's own accessors by this module (messages and ``optional`` scalars unset are
null, enums their name or their number as text, ``uint64`` a decimal, Timestamps UTC
instants truncated to microseconds; outside years 1-9999 the record is refused). What the
Python workers of Spark's path give (:func:`tidemark.spark.protobuf._decoder`, the function
``mapInArrow`` runs) must equal it, value for value, and refuse what it refuses.

``make test`` runs :data:`EXAMPLES` (200); ``TIDEMARK_DIFF_EXAMPLES`` sets more
(``make differential``). The counts are printed at the end of the module.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import struct
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.differential import comparable, report_counts
from tidemark.spark import protobuf
from tidemark.spark.protobuf import ProtobufSchemas, out_of_range_column, spark_type
from tidemark.spark.wire import header

EXAMPLES = int(os.environ.get("TIDEMARK_DIFF_EXAMPLES", "200"))
RECORDS = 30  # generated messages per schema
COUNTS: Counter[str] = Counter()
WRITER_ID, READER_ID = 11, 12
PACKAGE, MESSAGE = "diff", "diff.Msg"

# The wire kinds whose types Protobuf reads as each other (the compatibility rules of the language guide).
GROUPS = [
    ["int32", "int64", "uint32", "uint64", "bool", "enum"], ["sint32", "sint64"], ["fixed32", "sfixed32"],
    ["fixed64", "sfixed64"], ["string", "bytes"], ["float"], ["double"], ["inner"], ["timestamp"],
]  # fmt: skip
KINDS = [k for g in GROUPS for k in g]
SCALARS = [k for k in KINDS if k not in ("inner", "timestamp")]
MAP_KEYS = ["string", "int32", "int64", "uint32", "bool", "sint64", "fixed32"]
SECONDS = (-62_135_596_800, 253_402_300_799)  # 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Field:
    name: str
    number: int
    kind: str
    label: str  # "one", "optional", "repeated", "map", "oneof"
    key: str = "string"  # a map's key kind


@dataclass(frozen=True)
class Shape:
    fields: tuple[Field, ...]
    inner: tuple[Field, ...]  # diff.Inner's fields (scalars and a Timestamp)
    colors: tuple[str, ...]  # diff.Color's values, numbered from 0


@dataclass(frozen=True)
class Pair:
    writer: Shape
    reader: Shape
    refused: str | None  # why the pair must not resolve (a field's wire kind changed), or None


INNER = (Field("a", 1, "int64", "one"), Field("b", 2, "string", "one"), Field("t", 3, "timestamp", "one"),
         Field("c", 4, "sint32", "repeated"), Field("e", 5, "enum", "one"))  # fmt: skip


@st.composite
def fields(draw: st.DrawFn) -> tuple[Field, ...]:
    """A writer message's fields: kinds and labels drawn, numbered 1, 2, ..."""
    out = []
    for n in range(1, draw(st.integers(1, 10)) + 1):
        kind = draw(st.sampled_from(KINDS))
        labels = ["one", "repeated", "map", "oneof"] + (["optional"] if kind in SCALARS else [])
        label = draw(st.sampled_from(labels))
        out.append(Field(f"f{n}", n, kind, label, draw(st.sampled_from(MAP_KEYS)) if label == "map" else "string"))
    return tuple(out)


def _group(kind: str) -> list[str]:
    return next(g for g in GROUPS if kind in g)


@st.composite
def pairs(draw: st.DrawFn) -> Pair:
    """A writer and a reader: the same, a compatible evolution, or (one in six) a field's wire kind changed."""
    writer = Shape(draw(fields()), INNER, ("RED", "GREEN", "BLUE"))
    if draw(st.integers(0, 3)) == 0:
        return Pair(writer, writer, None)
    mine: list[Field] = []
    for f in writer.fields:
        change = draw(st.sampled_from(["keep", "keep", "drop", "rename", "retype", "into oneof"]))
        if change == "drop":
            continue
        if change == "rename":
            f = replace(f, name=f"{f.name}_renamed")
        elif change == "retype":
            f = replace(f, kind=draw(st.sampled_from(_group(f.kind))))
        elif change == "into oneof" and f.label == "one":
            f = replace(f, label="oneof")
        mine.append(f)
    for n in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(KINDS))
        mine.append(Field(f"added{n}", 100 + n, kind, draw(st.sampled_from(["one", "repeated"]))))
    inner = list(INNER)
    if draw(st.booleans()):  # the nested message evolves: a retype in its wire kind, a field added
        inner[0] = replace(inner[0], kind=draw(st.sampled_from(_group("int64"))))
        inner.append(Field("d", 6, "double", "one"))
    colors = draw(st.sampled_from([("RED", "GREEN", "BLUE"), ("RED", "GREEN", "BLUE", "BLACK"), ("RED", "GREEN")]))
    refused = None
    numbers = {f.number for f in writer.fields}
    shared = [i for i, f in enumerate(mine) if f.number in numbers]
    if shared and draw(st.integers(0, 5)) == 0:
        i = draw(st.sampled_from(shared))
        other = draw(st.sampled_from([k for k in KINDS if k not in _group(mine[i].kind)]))
        refused = f"field 'Msg.{mine[i].name}' (number {mine[i].number})"
        label = "one" if mine[i].label == "optional" and other not in SCALARS else mine[i].label
        mine[i] = replace(mine[i], kind=other, label=label)
    return Pair(writer, Shape(tuple(mine), tuple(inner), colors), refused)


def file_proto(shape: Shape, name: str = "diff/msg.proto") -> Any:
    """``diff.Msg`` (first in the file), ``diff.Inner`` and ``diff.Color`` of ``shape`` as a FileDescriptorProto."""
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name=name, package=PACKAGE, syntax="proto3", dependency=["google/protobuf/timestamp.proto"]
    )
    msg = proto.message_type.add(name="Msg")
    inner = proto.message_type.add(name="Inner")
    color = proto.enum_type.add(name="Color")
    for n, value in enumerate(shape.colors):
        color.value.add(name=value, number=n)

    def typed(field: Any, kind: str) -> None:
        if kind == "inner":
            field.type, field.type_name = fdp.TYPE_MESSAGE, ".diff.Inner"
        elif kind == "timestamp":
            field.type, field.type_name = fdp.TYPE_MESSAGE, ".google.protobuf.Timestamp"
        elif kind == "enum":
            field.type, field.type_name = fdp.TYPE_ENUM, ".diff.Color"
        else:
            field.type = getattr(fdp, "TYPE_" + kind.upper())

    def add(message: Any, f: Field) -> None:
        field = message.field.add(name=f.name, number=f.number, label=fdp.LABEL_OPTIONAL)
        if f.label == "repeated":
            field.label = fdp.LABEL_REPEATED
        if f.label == "map":
            entry_name = "".join(p.capitalize() for p in f.name.split("_")) + "Entry"
            entry = message.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            typed(entry.field.add(name="key", number=1, label=fdp.LABEL_OPTIONAL), f.key)
            typed(entry.field.add(name="value", number=2, label=fdp.LABEL_OPTIONAL), f.kind)
            field.label, field.type, field.type_name = fdp.LABEL_REPEATED, fdp.TYPE_MESSAGE, f".diff.Msg.{entry_name}"
            return
        typed(field, f.kind)
        if f.label == "optional":
            field.proto3_optional, field.oneof_index = True, len(message.oneof_decl)
            message.oneof_decl.add(name=f"_{f.name}")

    plain = [f for f in shape.fields if f.label != "oneof"]
    for f in [f for f in plain if f.label == "optional"] + [f for f in plain if f.label != "optional"]:
        add(msg, f)
    chosen = [f for f in shape.fields if f.label == "oneof"]
    if chosen:  # synthetic oneofs (optional) come after real ones in a valid descriptor: the real one first
        msg.oneof_decl.insert(0, descriptor_pb2.OneofDescriptorProto(name="choice"))
        for field in msg.field:
            if field.HasField("oneof_index"):
                field.oneof_index += 1
        for f in chosen:
            add(msg, f)
            msg.field[-1].oneof_index = 0
    for f in shape.inner:
        add(inner, f)
    return proto


def classes(shape: Shape) -> tuple[Any, list[bytes]]:
    """``diff.Msg``'s class for ``shape``, from a pool of its own, and the files (serialized, imports first)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    stamp = descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb)
    proto = file_proto(shape)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(stamp)
    pool.Add(proto)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(MESSAGE))
    return cls, [stamp.SerializeToString(), proto.SerializeToString()]


# ---- values, by a seeded generator -------------------------------------------------------------------------------

INTS = {
    "int32": (-(2**31), 2**31 - 1), "sint32": (-(2**31), 2**31 - 1), "sfixed32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1), "sint64": (-(2**63), 2**63 - 1), "sfixed64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1), "fixed32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1), "fixed64": (0, 2**64 - 1),
}  # fmt: skip


def scalar(kind: str, rng: random.Random, colors: int) -> Any:
    edge = rng.random() < 1 / 3
    if kind in INTS:
        low, high = INTS[kind]
        return rng.choice([low, high, 0, 1, high // 2 + 1]) if edge else rng.randint(low, high)
    if kind == "float":
        if edge:
            return rng.choice([math.nan, math.inf, -math.inf, -0.0, 3.4028234663852886e38, 1.401298464324817e-45])
        return float(struct.unpack("<f", struct.pack("<f", rng.uniform(-3e38, 3e38)))[0])
    if kind == "double":
        if edge:
            return rng.choice([math.nan, math.inf, -math.inf, -0.0, sys.float_info.max, 5e-324])
        return float(struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "string":
        if edge:
            return rng.choice(["", "é€😀" * 3000, "\x00"])
        return "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0xA0, 0xD7FF), rng.randint(0xE000, 0x10FFFF)]))
                       for _ in range(rng.randint(0, 12)))  # fmt: skip
    if kind == "bytes":
        return rng.choice([b"", b"\xff\x00" * 500]) if edge else rng.randbytes(rng.randint(0, 20))
    if kind == "enum":
        return rng.choice([*range(colors), 7, -1] if edge else list(range(colors)))
    raise AssertionError(kind)


def fill_timestamp(ts: Any, rng: random.Random, wild: bool) -> None:
    low, high = SECONDS
    if wild and rng.random() < 0.05:  # outside years 1-9999
        ts.seconds = rng.choice([low - 1, high + 1, -(2**40), 2**40])
    else:
        ts.seconds = rng.choice([low, high, 0, -1]) if rng.random() < 1 / 3 else rng.randint(low, high)
    ts.nanos = rng.choice([0, 999_999_999, 1_000, 999]) if rng.random() < 1 / 3 else rng.randint(0, 999_999_999)


def fill(message: Any, shape_fields: tuple[Field, ...], inner: tuple[Field, ...], rng: random.Random, wild: bool,
         colors: int) -> None:  # fmt: skip
    """Random values in ``message``'s fields of ``shape_fields``, each unset a fifth of the time."""
    chosen = [f for f in shape_fields if f.label == "oneof"]
    picked = rng.choice(chosen) if chosen and rng.random() < 0.8 else None
    for f in shape_fields:
        if (f.label == "oneof" and f is not picked) or rng.random() < 0.2:
            continue
        target = getattr(message, f.name)
        if f.label == "map":
            for _ in range(rng.randint(0, 3)):
                key = scalar(f.key, rng, colors)
                if f.kind == "inner":
                    fill(target[key], inner, (), rng, wild, colors)
                elif f.kind == "timestamp":
                    fill_timestamp(target[key], rng, wild)
                else:
                    target[key] = scalar(f.kind, rng, colors)
        elif f.label == "repeated":
            for _ in range(rng.randint(0, 3)):
                if f.kind == "inner":
                    fill(target.add(), inner, (), rng, wild, colors)
                elif f.kind == "timestamp":
                    fill_timestamp(target.add(), rng, wild)
                else:
                    target.append(scalar(f.kind, rng, colors))
        elif f.kind == "inner":
            target.SetInParent()
            fill(target, inner, (), rng, wild, colors)
        elif f.kind == "timestamp":
            target.SetInParent()
            fill_timestamp(target, rng, wild)
        else:
            setattr(message, f.name, scalar(f.kind, rng, colors))


# ---- the oracle ---------------------------------------------------------------------------------------------------


class OutOfRange(Exception):
    """A Timestamp outside years 1-9999: no column holds it."""


def oracle_value(fd: Any, v: Any) -> Any:
    """A value of field ``fd`` as read off the runtime's message."""
    if fd.type == fd.TYPE_ENUM:
        return fd.enum_type.values_by_number[v].name if v in fd.enum_type.values_by_number else str(v)
    if fd.type == fd.TYPE_MESSAGE and fd.message_type.full_name == "google.protobuf.Timestamp":
        if not SECONDS[0] <= v.seconds <= SECONDS[1]:
            raise OutOfRange
        return EPOCH + dt.timedelta(seconds=v.seconds, microseconds=v.nanos // 1000)
    if fd.type == fd.TYPE_MESSAGE:
        return oracle_message(v)
    if fd.type in (fd.TYPE_UINT64, fd.TYPE_FIXED64):
        return Decimal(v)
    return v


def oracle_message(m: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fd in m.DESCRIPTOR.fields:
        v = getattr(m, fd.name)
        entry = fd.message_type
        if fd.is_repeated and entry is not None and entry.GetOptions().map_entry:
            value_fd = entry.fields_by_name["value"]
            out[fd.name] = sorted((k, oracle_value(value_fd, x)) for k, x in v.items())
        elif fd.is_repeated:
            out[fd.name] = [oracle_value(fd, x) for x in v]
        elif fd.has_presence and not m.HasField(fd.name):
            out[fd.name] = None
        else:
            out[fd.name] = oracle_value(fd, v)
    return out


def _indexes(value: bytes) -> tuple[list[int], int] | None:
    """The message indexes after the 5-byte header (zigzag varints, a count then the path; 0 alone: ``[0]``)."""
    numbers: list[int] = []
    pos = 5
    while len(numbers) < 1 + (numbers[0] if numbers else 0):
        result = shift = 0
        while True:
            if pos >= len(value):
                return None
            byte = value[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        numbers.append((result >> 1) ^ -(result & 1))
        if numbers[0] < 0:
            return None
    return (numbers[1:] or [0]), pos


def oracle(reader_cls: Any, value: bytes) -> dict[str, Any] | str | None:
    """The runtime's reading of ``value`` with the reader's class: its values, ``"out of range"``, or None."""
    from google.protobuf.message import DecodeError

    found = _indexes(value)
    if found is None or found[0] != [0]:
        return None
    try:
        return oracle_message(reader_cls.FromString(value[found[1] :]))
    except DecodeError:
        return None
    except OutOfRange:
        return "out of range"


def corrupted(good: bytes, rng: random.Random) -> list[bytes]:
    frame = good[:6]
    return [good + b"\x00", good[:-1] if len(good) > 6 else good + b"\x80", frame + rng.randbytes(4),
            good[:5] + b"\x02\x02" + good[6:]]  # fmt: skip


# ---- the test -----------------------------------------------------------------------------------------------------


def _decode(schemas: ProtobufSchemas, values: list[bytes]) -> tuple[list[Any], list[str | None]]:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    out_type = to_arrow_type(spark_type(schemas.descriptor()), timezone="UTC")
    batch = pa.RecordBatch.from_pydict({
        "topic": ["t"] * len(values), "partition": [0] * len(values), "offset": list(range(len(values))),
        "value": pa.array(values, pa.binary()),
    })  # fmt: skip
    (out,) = list(protobuf._decoder(schemas, "parsed", out_type, "value")([batch]))
    return out.column("parsed").to_pylist(), out.column(out_of_range_column("parsed")).to_pylist()


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    report_counts(request, "Protobuf", EXAMPLES, COUNTS)


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(pair=pairs(), rng=st.randoms(use_true_random=True))
def test_differential_protobuf_decodes_every_value_as_the_runtime_or_refuses_it(pair: Pair, rng: random.Random) -> None:
    writer_cls, _ = classes(pair.writer)
    reader_cls, reader_files = classes(pair.reader)
    COUNTS["schemas"] += 1
    COUNTS["evolved readers"] += pair.reader != pair.writer

    problem = protobuf._incompatibility(reader_cls.DESCRIPTOR, writer_cls.DESCRIPTOR, "Msg")
    if pair.refused is not None:
        assert problem is not None and problem.startswith(pair.refused), (problem, pair.refused)
        COUNTS["incompatible pairs refused"] += 1
        return
    assert problem is None, problem

    messages = []
    for _ in range(RECORDS):
        m = writer_cls()
        fill(m, pair.writer.fields, pair.writer.inner, rng, True, len(pair.writer.colors))
        messages.append(m)
    frame = header(WRITER_ID) + b"\x00"
    values = [frame + m.SerializeToString() for m in messages]
    values += [b for v in values[:2] for b in corrupted(v, rng)]
    schemas = ProtobufSchemas(
        format="protobuf", subject="s", version=2, reader_id=READER_ID, writer_ids=(WRITER_ID,),
        files=tuple(reader_files), message=MESSAGE, index_names={WRITER_ID: {(0,): MESSAGE}},
    )  # fmt: skip
    parsed, out_of_range = _decode(schemas, values)

    for value, got, why in zip(values, parsed, out_of_range, strict=True):
        want = oracle(reader_cls, value)
        if want is None:
            assert got is None and why is None, got
            COUNTS["bodies refused as the runtime refuses them"] += 1
        elif want == "out of range":
            assert got is None and why is not None and why.startswith("Msg."), (got, why)
            COUNTS["Timestamps outside years 1-9999 refused naming the field"] += 1
        else:
            assert why is None and got is not None
            assert comparable(got) == comparable(want), (got, want)
            COUNTS["messages decoded as the runtime decodes them"] += 1


def test_the_oracle_reads_the_wire_format_s_indexes() -> None:
    assert _indexes(header(1) + b"\x00rest") == ([0], 6)
    assert _indexes(header(1) + b"\x04\x00\x02rest") == ([0, 1], 8)
    assert _indexes(header(1) + b"\x02") is None
