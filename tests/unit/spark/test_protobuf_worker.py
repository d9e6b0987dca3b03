"""What a Python worker decoding Protobuf values (``tidemark.spark.protobuf._decoder``) does with a value Spark's types
cannot hold, and with an error of its own: the first is a bad record naming the field, the second names the record."""

from __future__ import annotations

from typing import Any

import pytest

from tidemark.errors import ReadError
from tidemark.spark import protobuf
from tidemark.spark.protobuf import ProtobufSchemas, out_of_range_column, spark_type, timestamp_paths
from tidemark.spark.wire import header


def _schemas() -> tuple[ProtobufSchemas, Any]:
    """A file with ``shop.Tick {int32 id = 1; Timestamp at = 2; repeated Timestamp more = 3}``, and its class."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    field = descriptor_pb2.FieldDescriptorProto
    stamp = descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(
        name="shop/tick.proto", package="shop", syntax="proto3", dependency=["google/protobuf/timestamp.proto"]
    )
    tick = proto.message_type.add(name="Tick")
    tick.field.add(name="id", number=1, type=field.TYPE_INT32, label=field.LABEL_OPTIONAL)
    ts = ".google.protobuf.Timestamp"
    tick.field.add(name="at", number=2, type=field.TYPE_MESSAGE, type_name=ts, label=field.LABEL_OPTIONAL)
    tick.field.add(name="more", number=3, type=field.TYPE_MESSAGE, type_name=ts, label=field.LABEL_REPEATED)
    files = (stamp.SerializeToString(), proto.SerializeToString())
    schemas = ProtobufSchemas(
        format="protobuf", subject="s", version=1, reader_id=7, writer_ids=(7,), files=files, message="shop.Tick",
        index_names={7: {(0,): "shop.Tick"}},
    )  # fmt: skip
    pool = descriptor_pool.DescriptorPool()
    for f in (stamp, proto):
        pool.Add(f)
    return schemas, message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Tick"))


def _decode(schemas: ProtobufSchemas, values: list[bytes]) -> Any:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    out_type = to_arrow_type(spark_type(schemas.descriptor()), timezone="UTC")
    batch = pa.RecordBatch.from_pydict({
        "topic": ["t"] * len(values), "partition": [3] * len(values), "offset": list(range(40, 40 + len(values))),
        "value": pa.array(values, pa.binary()),
    })  # fmt: skip
    (out,) = list(protobuf._decoder(schemas, "parsed", out_type, "value")([batch]))
    return out


def test_timestamps_outside_spark_s_years_are_bad_records_naming_their_field() -> None:
    schemas, cls = _schemas()
    assert timestamp_paths(schemas.descriptor()) == ["Tick.at", "Tick.more[]"]
    ok, late, early = cls(id=1), cls(id=2), cls(id=3)
    ok.at.seconds, late.at.seconds = 1_764_115_200, 253_402_300_800  # 10000-01-01
    early.more.add(seconds=-62_135_596_801)  # the second before 0001-01-01
    frame = header(7) + b"\x00"
    out = _decode(schemas, [frame + m.SerializeToString() for m in (ok, late, early)])

    assert out.column(out_of_range_column("parsed")).to_pylist() == [None, "Tick.at", "Tick.more[]"]
    parsed = out.column("parsed").to_pylist()
    assert parsed[0]["id"] == 1 and parsed[1:] == [None, None]


def test_an_error_of_the_worker_itself_names_topic_partition_and_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    schemas, cls = _schemas()

    def broken(message: Any, path: str) -> Any:
        raise RuntimeError("something no one expected")

    monkeypatch.setattr(protobuf, "_struct", broken)
    with pytest.raises(ReadError, match=r"t\[3\] offset 40: its value did not decode as shop.Tick \(RuntimeError"):
        _decode(schemas, [header(7) + b"\x00" + cls(id=1).SerializeToString()])
