"""Protobuf's compatibility check in depth (``tidemark.spark.protobuf._incompatibility``): nested messages, map values,
repeated messages and well-known types, on descriptors built as a producer's generated code would hold them."""

from __future__ import annotations

from typing import Any

import pytest

from tidemark.spark.protobuf import _incompatibility


def _order(qty: str = "int32", at: str = ".google.protobuf.Timestamp", nested_qty: str | None = None) -> Any:
    """``shop.Order`` with a map of ``Line`` messages (``Line.qty`` of type ``qty``), a repeated ``Line2`` and a
    ``Box`` holding a ``Line2`` (``Line2.qty`` of type ``nested_qty``), and a field ``at`` of message type ``at``."""
    from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2

    field = descriptor_pb2.FieldDescriptorProto
    one, many = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    proto = descriptor_pb2.FileDescriptorProto(
        name="shop/order.proto", package="shop", syntax="proto3", dependency=["google/protobuf/timestamp.proto"]
    )
    line = proto.message_type.add(name="Line")
    line.field.add(name="sku", number=1, type=field.TYPE_STRING, label=one)
    line.field.add(name="qty", number=2, type=getattr(field, "TYPE_" + qty.upper()), label=one)
    line2 = proto.message_type.add(name="Line2")
    line2.field.add(name="sku", number=1, type=field.TYPE_STRING, label=one)
    line2.field.add(name="qty", number=2, type=getattr(field, "TYPE_" + (nested_qty or "int32").upper()), label=one)
    stamp = proto.message_type.add(name="Stamp")
    stamp.field.add(name="seconds", number=1, type=field.TYPE_INT64, label=one)
    stamp.field.add(name="nanos", number=2, type=field.TYPE_INT32, label=one)
    box = proto.message_type.add(name="Box")
    box.field.add(name="line", number=1, type=field.TYPE_MESSAGE, type_name=".shop.Line2", label=one)
    o = proto.message_type.add(name="Order")
    o.field.add(name="id", number=1, type=field.TYPE_INT32, label=one)
    o.field.add(name="lines", number=2, type=field.TYPE_MESSAGE, type_name=".shop.Order.LinesEntry", label=many)
    o.field.add(name="more", number=3, type=field.TYPE_MESSAGE, type_name=".shop.Line2", label=many)
    o.field.add(name="box", number=4, type=field.TYPE_MESSAGE, type_name=".shop.Box", label=one)
    o.field.add(name="at", number=5, type=field.TYPE_MESSAGE, type_name=at, label=one)
    entry = o.nested_type.add(name="LinesEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=one)
    entry.field.add(name="value", number=2, type=field.TYPE_MESSAGE, type_name=".shop.Line", label=one)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb))
    pool.Add(proto)
    return pool.FindMessageTypeByName("shop.Order")


def test_the_same_message_and_varint_retypes_resolve() -> None:
    assert _incompatibility(_order(), _order(), "Order") is None
    assert _incompatibility(_order(qty="int64"), _order(qty="int32"), "Order") is None  # one wire kind


@pytest.mark.parametrize(
    ("reader", "writer", "says"),
    [
        # A field retyped inside a map's value message: "7" would publish as 0.
        ({"qty": "int32"}, {"qty": "string"}, "field 'Order.lines.qty' (number 2) is string in the writer and int32"),
        # Inside a repeated message (the first of Line2's uses; Order.box.line.qty is one too).
        ({"nested_qty": "int32"}, {"nested_qty": "string"}, "field 'Order.more.qty' (number 2) is string"),
        # A message read as google.protobuf.Timestamp when the writer had another message: 1970-01-01 otherwise.
        ({}, {"at": ".shop.Stamp"}, "is message shop.Stamp in the writer and google.protobuf.Timestamp in the reader"),
        # And the other way round.
        ({"at": ".shop.Stamp"}, {}, "is message google.protobuf.Timestamp in the writer and shop.Stamp in the reader"),
    ],
)
def test_a_field_misread_anywhere_below_the_top_is_refused_naming_it(
    reader: dict[str, str], writer: dict[str, str], says: str
) -> None:
    problem = _incompatibility(_order(**reader), _order(**writer), "Order")
    assert problem is not None and says in problem, problem
