"""The registry formats behind one protocol: found by name, never imported by decoding, kept to their own schemas."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import grimp
import pytest

from tidemark.config.models import REGISTRY_FORMATS, Deserialization
from tidemark.errors import ConfigError
from tidemark.spark.avro import AvroSchemas
from tidemark.spark.decode import annotate, registry_reasons
from tidemark.spark.formats import FORMAT_MODULES, registry_format
from tidemark.spark.json_schema import JsonSchemas

FORMAT_PACKAGES = sorted(FORMAT_MODULES.values())
MILLIS = {"type": "record", "name": "Tick", "fields": [
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REGISTRY_FORMATS))
def test_every_registry_format_is_found_by_its_name(name: str) -> None:
    assert registry_format(name).name == name
    assert set(FORMAT_MODULES) == REGISTRY_FORMATS


def test_an_unknown_format_is_refused_naming_the_registry_formats() -> None:
    with pytest.raises(ConfigError, match=r"'json' is not a Schema Registry format; .*'avro', 'json_schema'"):
        registry_format("json")


def test_decoding_imports_no_format_and_no_format_imports_decoding() -> None:
    """The lookup by name is the only way from decoding to a format: no import either way, and no cycle in spark/
    (imports inside functions included)."""
    graph = grimp.build_graph("tidemark", cache_dir=None)
    for module in FORMAT_PACKAGES:
        assert not graph.direct_import_exists(importer="tidemark.spark.decode", imported=module)
        assert not graph.chain_exists(importer=module, imported="tidemark.spark.decode")
    spark_modules = {m for m in graph.modules if m.startswith("tidemark.spark.")}
    for module in sorted(spark_modules):
        below = graph.find_upstream_modules(module) & spark_modules
        assert not any(graph.chain_exists(importer=m, imported=module) for m in below), module


def _avro(*, fmt: str = "avro") -> AvroSchemas:
    text = json.dumps(MILLIS)
    return AvroSchemas(fmt, "t-value", 1, 7, (7,), reader=text, writers={7: text})


def test_reasons_take_the_run_schemas_of_their_own_format_only() -> None:
    overflow = (
        "value field 'at' is a timestamp-millis whose microseconds overflow a long (epoch nanoseconds or "
        "microseconds in a millis field?)"
    )
    assert registry_reasons("avro", "value", _avro())[-1] == overflow
    assert registry_reasons("protobuf", "value", _avro()) == registry_reasons("protobuf", "value")
    assert registry_reasons("avro", "value", _avro(fmt="json_schema")) == registry_reasons("avro", "value")


@pytest.mark.spark
def test_a_part_decoded_with_another_formats_schemas_is_refused(spark: Any) -> None:
    from tidemark.spark.source import SCHEMA

    df = spark.createDataFrame([("t", 0, 0, dt.datetime(2026, 1, 1, tzinfo=dt.UTC), 0, None, b"x", [], "p")], SCHEMA)
    schemas = JsonSchemas("json_schema", "t-value", 1, 7, (7,), reader='{"type": "object", "properties": {}}')
    with pytest.raises(ConfigError, match="format: avro decodes with the run's avro schemas, not json_schema schemas"):
        annotate(df, Deserialization(format="avro", key_format="bytes"), schemas)
    with pytest.raises(ConfigError, match="key_format: avro decodes with the run's schemas"):
        annotate(df, Deserialization(format="bytes", key_format="avro"))
