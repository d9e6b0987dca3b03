"""JSON Schema as its draft says, end to end on the real cluster and a real schema registry.

One feed run per construct (integers written as ``7.0``, RFC 3339 times in lower case,
``additionalProperties: false``, ``patternProperties``, ``$ref``, ``oneOf``/``anyOf``).
Each record's expected outcome is written beside it, and checked against an independent
oracle: the ``read_committed`` scan of the topic, each body parsed by ``json.loads`` and
validated by the ``jsonschema`` library under the schema's draft. A record is published,
with the parsed document's values, exactly when the oracle accepts it (and its values
fit their columns); otherwise it is quarantined with a reason naming the field.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import env_of
from tests.integration.job.test_registry_formats import RegistryEnv
from tidemark.spark.json_schema import REASON

pytestmark = [pytest.mark.integration, pytest.mark.spark]

UTC = dt.UTC
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?(Z|[+-]\d\d:\d\d)")


def oracle_checker() -> Any:
    """The test's own reading of the two typed formats (not Tidemark's code): RFC 3339 by a regex and datetime."""
    from jsonschema import FormatChecker

    def date_time(v: object) -> bool:
        if not isinstance(v, str) or not _RFC3339.fullmatch(v.upper()):
            return False
        try:
            dt.datetime.fromisoformat(v.upper().replace("Z", "+00:00"))
        except ValueError:
            return False
        return True

    def date(v: object) -> bool:
        if not isinstance(v, str) or not re.fullmatch(r"\d{4}-\d\d-\d\d", v):
            return False
        try:
            dt.date.fromisoformat(v)
        except ValueError:
            return False
        return True

    checker = FormatChecker(formats=())
    checker.checks("date-time")(date_time)
    checker.checks("date")(date)
    return checker


def oracle_valid(schema: dict[str, Any], doc: Any) -> bool:
    from jsonschema import validators

    cls = validators.validator_for(schema, default=validators.Draft7Validator)
    return bool(cls(schema, format_checker=oracle_checker()).is_valid(doc))


@dataclass(frozen=True)
class Case:
    schema: dict[str, Any]
    # body → the published values of the columns listed, or the quarantine reason's field and rule
    records: tuple[tuple[str, dict[str, Any] | str], ...]
    red_before: str  # what Tidemark did before


def _draft(url: str, properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"$schema": url, "type": "object", "properties": properties, **more}


D7 = "http://json-schema.org/draft-07/schema#"
D2020 = "https://json-schema.org/draft/2020-12/schema"

# fmt: off
CASES = {
    "integer_written_as_7.0": Case(
        _draft(D7, {"id": {"type": "integer"}, "n": {"type": "number"}}, required=["id"]),
        (
            ('{"id": 7.0, "n": 1}', {"id": 7, "n": 1.0}),
            ('{"id": 8, "n": 2.5}', {"id": 8, "n": 2.5}),
            ('{"id": 1e3}', {"id": 1000, "n": None}),
            ('{"id": 9.5}', "value field 'id' breaks the reader JSON Schema: 'type': \"integer\""),
            ('{"id": 9223372036854775808}', "value field 'id' is valid under the reader JSON Schema but is not a "
                                            "64-bit integer"),
        ),
        "7.0 quarantined as not a long",
    ),
    "date_time_in_lower_case": Case(
        _draft(D7, {"id": {"type": "integer"}, "at": {"type": "string", "format": "date-time"},
                    "day": {"type": "string", "format": "date"}}),
        (
            ('{"id": 1, "at": "2026-01-01t10:00:00z"}', {"id": 1, "at": dt.datetime(2026, 1, 1, 10, tzinfo=UTC)}),
            ('{"id": 2, "at": "2026-01-01T10:00:00.5+02:00", "day": "2026-02-28"}',
             {"id": 2, "at": dt.datetime(2026, 1, 1, 8, 0, 0, 500000, tzinfo=UTC), "day": dt.date(2026, 2, 28)}),
            ('{"id": 3, "at": "2026-01-01 10:00:00Z"}', "value field 'at' breaks the reader JSON Schema: 'format'"),
            ('{"id": 4, "at": "2026-02-30T10:00:00Z"}', "value field 'at' breaks the reader JSON Schema: 'format'"),
            ('{"id": 5, "day": "2026-1-01"}', "value field 'day' breaks the reader JSON Schema: 'format'"),
            ('{"id": 6, "at": "2026-01-01T10:00:00"}', "value field 'at' breaks the reader JSON Schema: 'format'"),
        ),
        "lower-case t/z quarantined, times without an offset published as local times",
    ),
    "additional_properties_false": Case(
        _draft(D7, {"id": {"type": "integer"}, "who": {"type": "object", "properties": {"name": {"type": "string"}},
                                                       "additionalProperties": False}},
               additionalProperties=False),
        (
            ('{"id": 1, "who": {"name": "a"}}', {"id": 1, "who": {"name": "a"}}),
            ('{"id": 2}', {"id": 2, "who": None}),
            ('{"id": 3, "extra": true}', "value has a property the reader JSON Schema does not allow "
                                         "('additionalProperties': false; it allows only id, who)"),
            ('{"id": 4, "who": {"name": "b", "age": 3}}', "value field 'who' has a property the reader JSON Schema "
                                                          "does not allow ('additionalProperties': false"),
        ),
        "published with the extra property silently dropped",
    ),
    "pattern_properties": Case(
        _draft(D7, {"id": {"type": "integer"},
                    "labels": {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "string"}},
                               "additionalProperties": False}},
               patternProperties={"^x-": {"type": "string"}}),
        (
            ('{"id": 1, "labels": {"env": "prod", "tier": "a"}}',
             {"id": 1, "labels": [("env", "prod"), ("tier", "a")]}),
            ('{"id": 2, "x-trace": "t1"}', {"id": 2, "labels": None}),
            ('{"id": 3, "labels": {"Env": "prod"}}',
             "value field 'labels' has a property the reader JSON Schema does not allow ('additionalProperties': "
             "false; it allows only /^[a-z]+$/)"),
            ('{"id": 4, "labels": {"env": 5}}', "value field 'labels.*' breaks the reader JSON Schema: 'type'"),
            ('{"id": 5, "x-trace": 5}', "value field '*' breaks the reader JSON Schema: 'type': \"string\""),
        ),
        "refused at planning (an object of patternProperties has no type); their rules never checked",
    ),
    "ref": Case(
        _draft(D2020, {"id": {"type": "integer"}, "price": {"$ref": "#/$defs/Money"}},
               **{"$defs": {
                   "Money": {"type": "object", "required": ["currency"], "additionalProperties": False,
                             "properties": {"amount": {"$ref": "#/$defs/a~1b"},
                                            "currency": {"$ref": "#/$defs/Currency"}}},
                   "Currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
                   "a/b": {"type": "number", "minimum": 0}}}),
        (
            ('{"id": 1, "price": {"amount": 2.5, "currency": "EUR"}}',
             {"id": 1, "price": {"amount": 2.5, "currency": "EUR"}}),
            ('{"id": 2, "price": {"amount": 2.5, "currency": "eur"}}',
             "value field 'price.currency' breaks the reader JSON Schema: 'pattern': \"^[A-Z]{3}$\""),
            ('{"id": 3, "price": {"amount": -1, "currency": "EUR"}}',
             "value field 'price.amount' breaks the reader JSON Schema: 'minimum': 0"),
            ('{"id": 4, "price": {"amount": 1}}',
             "value field 'price.currency' is missing, and the reader JSON Schema requires it"),
        ),
        "rules behind a $ref (pattern, minimum) never checked: 'eur' and -1 published",
    ),
    "one_of_any_of": Case(
        _draft(D7, {"id": {"type": "integer"},
                    "qty": {"oneOf": [{"type": "integer", "multipleOf": 2}, {"type": "integer", "multipleOf": 3}]},
                    "ref": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "string", "pattern": "^X"},
                                      {"type": "null"}]}}),
        (
            ('{"id": 1, "qty": 4, "ref": "ab"}', {"id": 1, "qty": 4, "ref": "ab"}),
            ('{"id": 2, "qty": 9, "ref": "Xlonger"}', {"id": 2, "qty": 9, "ref": "Xlonger"}),
            ('{"id": 3, "ref": null}', {"id": 3, "qty": None, "ref": None}),
            ('{"id": 4, "qty": 6}', "value field 'qty' breaks 'oneOf' of the reader JSON Schema"),
            ('{"id": 5, "qty": 4, "ref": "toolong"}', "value field 'ref'"),
        ),
        "refused at planning: oneOf of two integer schemas 'has no single Spark type'",
    ),
}
# fmt: on


class FidelityEnv(RegistryEnv):
    # Most of each case's records are bad on purpose: none may fail the run.
    feed_options: ClassVar[dict[str, Any]] = {
        "validation": {"on_bad_records": "quarantine", "quarantine_max_ratio": 1.0, "expectations": []}
    }


@pytest.fixture
def env(
    kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> FidelityEnv:
    return env_of(FidelityEnv, kafka, registry, tmp_path, spark, monkeypatch)


def _as_read(value: Any) -> Any:
    """A value as Parquet hands it back, comparable with the expected one (timestamps in UTC)."""
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, dict):
        return {k: _as_read(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_read(v) for v in value]
    return value


@pytest.mark.parametrize("name", list(CASES))
def test_json_schema_record_is_published_as_jsonschema_reads_it_or_quarantined_naming_the_field(
    env: FidelityEnv, name: str
) -> None:
    from confluent_kafka.schema_registry import Schema

    case = CASES[name]
    schema_id = env.sr.register_schema(f"{env.topic}-value", Schema(json.dumps(case.schema), "JSON"))
    env.write_feed(format="json_schema")
    prefix = b"\x00" + schema_id.to_bytes(4, "big")
    for partition in range(2):
        env.produce([prefix + body.encode() for body, _ in case.records[partition::2]], partition)

    env.run()

    # The oracle: the read_committed scan, each body read by json.loads and judged by jsonschema.
    scanned = env.scan_with(lambda v: json.loads(v[5:]))
    expected = {(i % 2, i // 2): outcome for i, (_, outcome) in enumerate(case.records)}
    assert scanned.keys() == expected.keys()
    for k, doc in scanned.items():
        fits = isinstance(expected[k], dict) or "is valid under the reader JSON Schema" in str(expected[k])
        assert oracle_valid(case.schema, doc) == fits, (name, doc)

    columns = list(case.schema["properties"])
    published = {k: _as_read({c: r[c] for c in columns}) for k, r in env.published().items()}
    assert published == {
        k: {c: want.get(c) for c in columns} for k, want in expected.items() if isinstance(want, dict)
    }, case.red_before
    reasons = {(q["partition"], q["offset"]): q["_reason"] for q in env.quarantined()}
    bad = {k: want for k, want in expected.items() if isinstance(want, str)}
    assert reasons.keys() == bad.keys(), case.red_before
    assert [k for k, why in reasons.items() if bad[k] not in why] == [], reasons
    assert env.committed() == {0: sum(1 for k in expected if k[0] == 0), 1: sum(1 for k in expected if k[0] == 1)}


E2E_EXAMPLES = int(os.environ.get("TIDEMARK_DIFF_E2E_EXAMPLES", "2"))
E2E_RECORDS = 300


@settings(max_examples=E2E_EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(data=st.data())
def test_differential_generated_schemas_end_to_end_publish_what_jsonschema_accepts(
    data: Any, kafka: KafkaTestCluster, registry: str, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Generated schemas of every draft, each with many generated records (edge values, corrupted bodies), through a
    whole run: what is published and what is quarantined agree with the oracle over the ``read_committed`` scan."""
    from confluent_kafka.schema_registry import Schema

    from tests.unit.spark import test_json_schema_fidelity as diff

    schema, shape = data.draw(diff.schemas())
    bodies = [diff._body(data.draw, data.draw(diff.instances(shape))) for _ in range(E2E_RECORDS)]
    with pytest.MonkeyPatch.context() as monkeypatch:
        env = env_of(FidelityEnv, kafka, registry, tmp_path_factory.mktemp("diff"), spark, monkeypatch)
        schema_id = env.sr.register_schema(f"{env.topic}-value", Schema(json.dumps(schema), "JSON"))
        env.write_feed(format="json_schema")
        prefix = b"\x00" + schema_id.to_bytes(4, "big")
        for partition in range(2):
            env.produce([prefix + body for body in bodies[partition::2]], partition)

        env.run()

        reference = diff.oracle_validator(schema)
        scanned = env.scan_with(lambda v: diff.oracle(reference, shape, v[5:]))
        published = {k: _as_read({c: r[c] for c in schema["properties"]}) for k, r in env.published().items()}
        reasons = {
            (q["partition"], q["offset"]): q["_reason"].removeprefix("decode_error: ") for q in env.quarantined()
        }
    assert len(scanned) == E2E_RECORDS and published.keys() | reasons.keys() == scanned.keys()
    for k, (verdict, expected) in scanned.items():
        got = {**published[k], REASON: None} if k in published else {REASON: reasons[k]}
        diff.assert_same_verdict(verdict, expected, got, (schema, k))
    diff.COUNTS["e2e_schemas"] = diff.COUNTS.get("e2e_schemas", 0) + 1
    diff.COUNTS["e2e_records"] = diff.COUNTS.get("e2e_records", 0) + len(scanned)
    print(f"\njson_schema differential end to end: {diff.COUNTS}")  # the run's note needs the counts


def test_a_reader_field_without_one_spark_type_fails_the_run_naming_subject_version_and_field(
    env: FidelityEnv,
) -> None:
    from confluent_kafka.schema_registry import Schema

    schema = _draft(D7, {"id": {"type": "integer"}, "code": {"type": ["string", "integer"]}})
    schema_id = env.sr.register_schema(f"{env.topic}-value", Schema(json.dumps(schema), "JSON"))
    env.write_feed(format="json_schema")
    env.produce([b"\x00" + schema_id.to_bytes(4, "big") + b'{"id": 1, "code": 7}'], 0)

    with pytest.raises(Exception, match="does not map onto Spark types") as info:
        env.run()

    env.assert_refused(info, f"subject '{env.topic}-value' version 1", "$.code: type ['string', 'integer'] has no "
                       "single Spark type", "nothing was published or committed")  # fmt: skip


def test_a_writer_property_the_pinned_reader_forbids_quarantines_the_record_naming_the_property(
    env: FidelityEnv,
) -> None:
    from confluent_kafka.schema_registry import Schema

    v1 = _draft(D7, {"id": {"type": "integer"}, "name": {"type": "string"}}, additionalProperties=False)
    v2 = _draft(D7, {"id": {"type": "integer"}, "name": {"type": "string"}, "note": {"type": "string"}})
    subject = f"{env.topic}-value"
    first = env.sr.register_schema(subject, Schema(json.dumps(v1), "JSON"))
    second = env.sr.register_schema(subject, Schema(json.dumps(v2), "JSON"))
    env.write_feed(format="json_schema", schema_version=1)
    old, new = (b"\x00" + sid.to_bytes(4, "big") for sid in (first, second))
    env.produce([old + b'{"id": 1, "name": "a"}', new + b'{"id": 2, "name": "b"}'], 0)
    env.produce([new + b'{"id": 3, "name": "c", "note": "n"}', old + b'{"id": 4, "name": "d", "zz": 1}'], 1)

    env.run()

    published = {k: (r["id"], r["name"]) for k, r in env.published().items()}
    assert published == {(0, 0): (1, "a"), (0, 1): (2, "b")}
    assert {(q["partition"], q["offset"]): q["_reason"] for q in env.quarantined()} == {
        (1, 0): "decode_error: value has property 'note', which the reader JSON Schema does not allow "
        "('additionalProperties': false)",
        (1, 1): "decode_error: value has a property the reader JSON Schema does not allow ('additionalProperties': "
        "false; it allows only id, name)",
    }
    assert env.committed() == {0: 2, 1: 2}
