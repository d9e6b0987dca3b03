"""What the differential tests share: values put in one comparable form, Avro's booleans as the spec says them,
and the closing count line."""

from __future__ import annotations

import datetime as dt
import io
import math
from collections.abc import Mapping
from typing import Any

import fastavro
import pytest
from fastavro import _read_py, _write_py
from fastavro.io.binary_decoder import BinaryDecoder
from fastavro.io.binary_encoder import BinaryEncoder


def comparable(v: Any) -> Any:
    """``v`` in a form both decoders' results compare in: NaN equal to itself, maps (lists of key-value pairs)
    as sorted pairs, timestamps as aware UTC."""
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, dict):
        return {k: comparable(x) for k, x in v.items()}
    if isinstance(v, list):
        pairs = v and all(isinstance(x, tuple) and len(x) == 2 for x in v)
        return sorted((k, comparable(x)) for k, x in v) if pairs else [comparable(x) for x in v]
    if isinstance(v, dt.datetime):
        return v.replace(tzinfo=dt.UTC) if v.tzinfo is None else v.astimezone(dt.UTC)
    return v


def report_counts(request: pytest.FixtureRequest, title: str, examples: int, counts: Mapping[str, int]) -> None:
    """One line of what a differential run generated and checked, shown whether or not pytest captures output."""
    line = f"differential {title} ({examples} examples asked): " + ", ".join(
        f"{k} {v}" for k, v in sorted(counts.items())
    )
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        print(f"\n{line}")


# fastavro reads any boolean byte but 0 as true ("many languages will cast anything other than 0 to True"), and a
# negative union index as a branch counted from the end (Python's list[-1]); the spec allows a boolean only 0 and 1,
# and a union index only one of its branches (Java's reader refuses -1). Its pure-Python reader and writer take the
# decoder and encoder as arguments (private modules, but fastavro's own walk of the schema), so the tests read and
# write Avro as the spec says it.


class _NotSpec(Exception):
    pass


class _SpecBooleans(BinaryDecoder):  # type: ignore[misc]
    def read_boolean(self) -> bool:
        data = self.fo.read(1)
        if not data:
            raise EOFError
        if data[0] > 1:
            raise _NotSpec(f"a boolean byte {data[0]}: Avro allows only 0 and 1")
        return bool(data[0])

    def read_index(self) -> int:
        index = int(self.read_long())  # type: ignore[no-untyped-call]
        if index < 0:
            raise _NotSpec(f"a union index {index}")
        return index


class _BooleansAs(BinaryEncoder):  # type: ignore[misc]
    def __init__(self, fo: io.BytesIO, byte: int) -> None:
        super().__init__(fo)  # type: ignore[no-untyped-call]
        self.byte = byte

    def write_boolean(self, datum: bool) -> None:
        self._fo.write(bytes([self.byte]))


def avro_within_spec(writer: Any, body: bytes) -> bool:
    """Whether ``body`` decodes with ``writer`` (schema JSON) with every boolean, at any depth, the byte 0 or 1 and
    every union index not negative: read by fastavro's pure-Python reader with a decoder that refuses the others
    (fastavro's own reads them; the other checks of a body are the callers')."""
    named = _read_py._default_named_schemas()
    parsed = fastavro.parse_schema(writer, named["writer"])
    decoder = _SpecBooleans(io.BytesIO(body))  # type: ignore[no-untyped-call]
    try:
        _read_py.read_data(decoder, parsed, named, None, {})  # type: ignore[no-untyped-call]
    except _NotSpec:
        return False
    except Exception:  # noqa: BLE001 - another failure is the other checks' to find: only booleans are judged here
        return True
    return True


def avro_with_boolean_bytes(schema: Any, record: Any, byte: int) -> bytes:
    """``record``'s Avro body under ``schema`` (schema JSON, no framing) with every boolean, at any depth, written as
    ``byte`` (fastavro's pure-Python writer, its encoder's booleans replaced)."""
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(schema, named)
    out = io.BytesIO()
    encoder = _BooleansAs(out, byte)
    _write_py.write_data(encoder, record, parsed, named, "", {})  # type: ignore[no-untyped-call]
    encoder.flush()  # type: ignore[no-untyped-call]
    return out.getvalue()
