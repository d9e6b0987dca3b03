"""JSON Schema records judged as the ``jsonschema`` library and ``json.loads`` judge them: one test per construct,
then a differential property-based test over generated schemas and instances.

The decoding function under test is :class:`tidemark.spark.json_schema.RecordChecker`, the one the
Python workers call for every record (Spark's path; JSON Schema has no read-task path). The oracle
is written here, apart from Tidemark's code: ``jsonschema`` under the schema's draft with a format
checker of its own (a regex and ``datetime``), ``json.loads``, and a typing of the parsed values by
the shape the generator built. ``TIDEMARK_DIFF_EXAMPLES`` sets how many schemas are generated
(default 100, each checked against 12 instances); the run prints the counts.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemark.spark.json_schema import REASON, JsonSchemas, RecordChecker, spark_type

UTC = dt.UTC
PREFIX = b"\x00" + (7).to_bytes(4, "big")
D4 = "http://json-schema.org/draft-04/schema#"
D6 = "http://json-schema.org/draft-06/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
D2019 = "https://json-schema.org/draft/2019-09/schema"
D2020 = "https://json-schema.org/draft/2020-12/schema"


def checker(schema: dict[str, Any], part: str = "value") -> RecordChecker:
    text = json.dumps(schema)
    return RecordChecker(JsonSchemas("json_schema", "s-value", 1, 7, (7,), reader=text, writers=((7, text),),
                                     part=part))  # type: ignore[arg-type]  # fmt: skip


def check(schema: dict[str, Any], body: str | bytes) -> dict[str, Any]:
    return checker(schema).check(PREFIX + (body.encode() if isinstance(body, str) else body))


def obj(props: dict[str, Any], url: str = D7, **more: Any) -> dict[str, Any]:
    return {"$schema": url, "type": "object", "properties": props, **more}


# -- one test per construct --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "is_integer"), [(D4, False), (D6, True), (D7, True), (D2019, True), (D2020, True)])
def test_7_0_is_an_integer_from_draft_6_on_and_published_as_7(url: str, is_integer: bool) -> None:
    got = check(obj({"id": {"type": "integer"}}, url), '{"id": 7.0}')
    if is_integer:
        assert got == {"id": 7, REASON: None} and isinstance(got["id"], int)
    else:  # Draft 4: an integer is a number without a fraction *written*
        assert got == {REASON: "value field 'id' breaks the reader JSON Schema: 'type': \"integer\""}


def test_integers_beyond_64_bits_and_doubles_that_would_round_are_quarantined_naming_the_field() -> None:
    schema = obj({"id": {"type": "integer"}, "x": {"type": "number"}})
    assert check(schema, '{"id": 9223372036854775807, "x": 9007199254740992}') == {
        "id": 2**63 - 1, "x": 2.0**53, REASON: None}  # fmt: skip
    assert check(schema, '{"id": -9223372036854775809}')[REASON] == (
        "value field 'id' is valid under the reader JSON Schema but is not a 64-bit integer, its column's type"
    )
    assert check(schema, '{"x": 9007199254740993}')[REASON].startswith(
        "value field 'x' is valid under the reader JSON Schema but is not a double without rounding"
    )


@pytest.mark.parametrize(
    ("text", "instant"),
    [
        ("2026-01-01t10:00:00z", dt.datetime(2026, 1, 1, 10, tzinfo=UTC)),
        ("2026-01-01T10:00:00Z", dt.datetime(2026, 1, 1, 10, tzinfo=UTC)),
        ("2026-01-01T10:00:00.123456-01:30", dt.datetime(2026, 1, 1, 11, 30, 0, 123456, tzinfo=UTC)),
        ("2026-01-01T10:00:00.100000000+00:00", dt.datetime(2026, 1, 1, 10, 0, 0, 100000, tzinfo=UTC)),
        ("2024-02-29T00:00:00Z", dt.datetime(2024, 2, 29, tzinfo=UTC)),
    ],
)
def test_rfc3339_date_times_in_either_case_are_published_as_their_utc_instant(text: str, instant: dt.datetime) -> None:
    assert check(obj({"at": {"type": "string", "format": "date-time"}}), json.dumps({"at": text})) == {
        "at": instant, REASON: None}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("2026-01-01 10:00:00Z", "breaks the reader JSON Schema: 'format': \"date-time\""),  # a space is not RFC 3339
        ("2026-01-01T10:00:00", "breaks the reader JSON Schema: 'format': \"date-time\""),  # no offset
        ("2025-02-29T00:00:00Z", "breaks the reader JSON Schema: 'format': \"date-time\""),
        ("2026-01-01T24:00:00Z", "breaks the reader JSON Schema: 'format': \"date-time\""),
        ("2026-12-31T23:59:60Z", "is not a UTC timestamp"),  # a leap second: valid, but no timestamp holds it
        ("2026-01-01T10:00:00.1234567Z", "is not a UTC timestamp"),  # nanoseconds: no microsecond holds them
        ("0001-01-01T00:00:00+01:00", "is not a UTC timestamp"),  # year 0 in UTC
    ],
)
def test_date_times_no_column_can_take_are_quarantined_naming_the_field(text: str, why: str) -> None:
    got = check(obj({"at": {"type": "string", "format": "date-time"}}), json.dumps({"at": text}))
    assert got[REASON].startswith("value field 'at' ") and why in got[REASON]


def test_additional_properties_false_quarantines_the_record_naming_the_object_and_what_it_allows() -> None:
    schema = obj({"id": {"type": "integer"}, "who": {"type": "object", "additionalProperties": False,
                                                     "properties": {"name": {"type": "string"}}}},
                 additionalProperties=False)  # fmt: skip
    assert check(schema, '{"id": 1, "who": {"name": "a"}}') == {"id": 1, "who": {"name": "a"}, REASON: None}
    assert check(schema, '{"id": 1, "extra": 2}')[REASON] == (
        "value has a property the reader JSON Schema does not allow ('additionalProperties': false; it allows only "
        "id, who)"
    )
    assert check(schema, '{"id": 1, "who": {"name": "a", "age": 3}}')[REASON] == (
        "value field 'who' has a property the reader JSON Schema does not allow ('additionalProperties': false; it "
        "allows only name)"
    )
    # Without additionalProperties: false, a property the reader does not list is not a column (the reader's view).
    assert check(obj({"id": {"type": "integer"}}), '{"id": 1, "extra": 2}') == {"id": 1, REASON: None}


def test_pattern_properties_are_checked_and_an_object_of_them_alone_is_a_map() -> None:
    schema = obj({"labels": {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}},
                             "additionalProperties": False}},
                 patternProperties={"^x-": {"type": "string"}})  # fmt: skip
    assert check(schema, '{"labels": {"a": 1, "b": 2}, "x-t": "s"}') == {"labels": [("a", 1), ("b", 2)], REASON: None}
    assert check(schema, '{"x-t": 5}')[REASON] == "value field '*' breaks the reader JSON Schema: 'type': \"string\""
    assert check(schema, '{"labels": {"a": "1"}}')[REASON] == (
        "value field 'labels.*' breaks the reader JSON Schema: 'type': \"integer\""
    )
    assert check(schema, '{"labels": {"A": 1}}')[REASON].startswith("value field 'labels' has a property")
    # No additionalProperties: false, so a key no pattern matches may hold anything, which an integer map cannot.
    loose = obj({"labels": {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}}}})
    assert check(loose, '{"labels": {"A": "x"}}')[REASON] == (
        "value field 'labels.*' is valid under the reader JSON Schema but is not a 64-bit integer, its column's type"
    )


def test_ref_rules_are_checked_through_pointers_and_escapes() -> None:
    schema = obj({"price": {"$ref": "#/$defs/Money"}}, D2020, **{"$defs": {
        "Money": {"type": "object", "required": ["currency"],
                  "properties": {"amount": {"$ref": "#/$defs/a~1b"}, "currency": {"$ref": "#/$defs/Currency"}}},
        "Currency": {"type": "string", "pattern": "^[A-Z]{3}$"}, "a/b": {"type": "number", "minimum": 0}}})  # fmt: skip
    assert check(schema, '{"price": {"amount": 2.5, "currency": "EUR"}}') == {
        "price": {"amount": 2.5, "currency": "EUR"}, REASON: None}  # fmt: skip
    assert check(schema, '{"price": {"currency": "eur"}}')[REASON] == (
        "value field 'price.currency' breaks the reader JSON Schema: 'pattern': \"^[A-Z]{3}$\""
    )
    assert check(schema, '{"price": {"amount": -1, "currency": "EUR"}}')[REASON] == (
        "value field 'price.amount' breaks the reader JSON Schema: 'minimum': 0"
    )
    assert check(schema, '{"price": {}}')[REASON] == (
        "value field 'price.currency' is missing, and the reader JSON Schema requires it"
    )


def test_one_of_and_any_of_of_one_type_resolve_to_it_and_are_checked() -> None:
    from pyspark.sql import types as T

    schema = obj({"qty": {"oneOf": [{"type": "integer", "multipleOf": 2}, {"type": "integer", "multipleOf": 3}]},
                  "ref": {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "string", "pattern": "^X"},
                                    {"type": "null"}]}})  # fmt: skip
    assert spark_type(schema) == T.StructType(
        [T.StructField("qty", T.LongType()), T.StructField("ref", T.StringType())]
    )
    assert check(schema, '{"qty": 4, "ref": "Xlong"}') == {"qty": 4, "ref": "Xlong", REASON: None}
    assert check(schema, '{"qty": 9, "ref": null}') == {"qty": 9, "ref": None, REASON: None}
    assert check(schema, '{"qty": 6}')[REASON] == "value field 'qty' breaks 'oneOf' of the reader JSON Schema"
    assert check(schema, '{"ref": "long"}')[REASON].startswith("value field 'ref' ")


def test_required_and_enum_name_the_field_and_bodies_that_are_not_json_say_so() -> None:
    schema = obj({"s": {"enum": ["A", "B"]}, "n": {"enum": [1, 2, None]}}, required=["s"])
    assert check(schema, '{"s": "A", "n": null}') == {"s": "A", "n": None, REASON: None}
    assert check(schema, '{"n": 1}')[REASON] == "value field 's' is missing, and the reader JSON Schema requires it"
    assert (
        check(schema, '{"s": "C"}')[REASON] == "value field 's' breaks the reader JSON Schema: 'enum': [\"A\", \"B\"]"
    )
    assert check(schema, b'{"s": "\xff"}')[REASON] == "value is not valid UTF-8"
    assert check(schema, '{"s": "A"')[REASON] == "value is not JSON (RFC 8259, as json.loads reads it)"
    assert check(schema, '"A"')[REASON] == "value breaks the reader JSON Schema: 'type': \"object\""


def test_edge_bodies_read_as_json_loads_reads_them() -> None:
    schema = obj({"x": {"type": "number"}, "s": {"type": "string"}})
    nan = check(schema, '{"x": NaN}')  # json.dumps writes NaN (allow_nan), json.loads reads it, jsonschema takes it
    assert math.isnan(nan["x"]) and nan[REASON] is None
    assert check(schema, '{"x": -Infinity, "s": ""}') == {"x": -math.inf, "s": "", REASON: None}
    # A repeated key: the last, as json.loads reads it.
    assert check(schema, '{"x": 1, "x": 2.5}') == {"x": 2.5, "s": None, REASON: None}
    huge = "é" * 1_000_000
    assert check(schema, json.dumps({"s": huge}, ensure_ascii=False)) == {"x": None, "s": huge, REASON: None}
    deep = '{"s": "a", "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert check(schema, deep)[REASON] == "value is not JSON (RFC 8259, as json.loads reads it)"  # nor to json.loads


def test_a_record_valid_under_the_reader_but_not_its_writer_is_quarantined_naming_the_writer() -> None:
    reader = obj({"id": {"type": "integer"}})
    writer = obj({"id": {"type": "integer", "maximum": 10}})
    schemas = JsonSchemas("json_schema", "s", 2, 8, (7, 8), reader=json.dumps(reader),
                          writers=((7, json.dumps(writer)), (8, json.dumps(reader))))  # fmt: skip
    c = RecordChecker(schemas)
    assert c.check(PREFIX + b'{"id": 11}')[REASON] == (
        "value field 'id' breaks its writer JSON Schema (id 7): 'maximum': 10"
    )
    assert c.check(b"\x00" + (8).to_bytes(4, "big") + b'{"id": 11}') == {"id": 11, REASON: None}
    assert "value field 'id' breaks its writer JSON Schema (id 7): 'maximum': 10" in schemas.reasons()


@pytest.mark.parametrize(
    ("prop", "why"),
    [
        ({"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"required": ["a"]}]}, None),
        (
            {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"a": {"type": "string"}}}]},
            "no single Spark type",
        ),
        (
            {"type": "object", "patternProperties": {"^a": {"type": "string"}, "^b": {"type": "integer"}}},
            "several types",
        ),
        ({}, "admits any JSON value"),
        ({"type": "array", "items": [{"type": "string"}]}, "without one 'items' schema"),
        ({"enum": ["a", 1]}, "no single Spark type"),
        ({"$ref": "#/$defs/missing"}, "names nothing"),
    ],
)
def test_constructs_without_one_spark_type_are_refused_naming_the_field(prop: dict[str, Any], why: str | None) -> None:
    doc = obj({"p": prop})
    if why is None:
        spark_type(doc)  # its own type; anyOf only adds rules
        return
    with pytest.raises(ValueError, match=why) as info:
        spark_type(doc)
    assert str(info.value).startswith("$.p")


# -- the differential test ---------------------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("TIDEMARK_DIFF_EXAMPLES", "100"))
INSTANCES = 12
COUNTS = dict.fromkeys(("schemas", "cases", "published", "invalid", "unfit", "undecodable", "named_no_field"), 0)
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:(\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)")
Shape = Any  # "long" | "double" | "string" | "boolean" | "date" | "timestamp" | (kind, children)


def _oracle_date_time(v: object) -> bool:
    m = _RFC3339.fullmatch(v.upper()) if isinstance(v, str) else None
    if m is None:
        return isinstance(v, str) is False
    text = v.upper().replace("Z", "+00:00")  # type: ignore[union-attr]
    if m.group(1) == "60":  # a leap second is RFC 3339; datetime cannot parse it
        text = text[:17] + "59" + text[19:]
    try:
        dt.datetime.fromisoformat(re.sub(r"\.(\d+)", lambda f: "." + f.group(1)[:6], text))
    except ValueError:
        return False
    return True


def _oracle_date(v: object) -> bool:
    if not isinstance(v, str):
        return True
    try:
        return bool(re.fullmatch(r"\d{4}-\d\d-\d\d", v)) and dt.date.fromisoformat(v) is not None
    except ValueError:
        return False


def oracle_validator(schema: dict[str, Any]) -> Any:
    from jsonschema import FormatChecker, validators

    formats = FormatChecker(formats=())
    formats.checks("date-time")(_oracle_date_time)
    formats.checks("date")(_oracle_date)
    return validators.validator_for(schema, default=validators.Draft7Validator)(schema, format_checker=formats)


class Unfit(Exception):
    pass


def oracle_values(v: Any, shape: Shape) -> Any:
    """The parsed value as its column holds it, or :class:`Unfit` (the test's own typing, by the generated shape)."""
    if v is None:
        return None
    if isinstance(shape, tuple):
        kind, child = shape
        if kind == "struct" and isinstance(v, dict):
            return {n: oracle_values(v.get(n), s) for n, s in child.items()}
        if kind == "map" and isinstance(v, dict):
            return [(k, oracle_values(x, child)) for k, x in v.items()]
        if kind == "array" and isinstance(v, list):
            return [oracle_values(x, child) for x in v]
        raise Unfit
    if shape == "boolean" and isinstance(v, bool):
        return v
    if isinstance(v, bool):
        raise Unfit
    if shape == "long" and isinstance(v, (int, float)) and float(v).is_integer() and -(2**63) <= v < 2**63:
        return int(v)
    if shape == "double" and isinstance(v, float):
        return v
    if shape == "double" and isinstance(v, int) and abs(v) < 2**1000 and float(v) == v:
        return float(v)
    if shape == "string" and isinstance(v, str):
        return v
    if shape == "date" and isinstance(v, str):
        return dt.date.fromisoformat(v)
    if shape == "timestamp" and isinstance(v, str):
        m = _RFC3339.fullmatch(v.upper())
        assert m is not None  # the format held
        fraction = (m.group(2) or ".")[1:]
        if m.group(1) == "60" or fraction[6:].strip("0"):
            raise Unfit
        text = re.sub(r"\.(\d+)", lambda f: "." + f.group(1)[:6], v.upper().replace("Z", "+00:00"))
        try:
            return dt.datetime.fromisoformat(text).astimezone(UTC)
        except (ValueError, OverflowError):
            raise Unfit from None
    raise Unfit


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN, types included (1 is not 1.0 in a long column)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


NAMES = st.sampled_from(["a", "b", "id", "x-y", "é", "n2", "z"])


@st.composite
def leaves(draw: st.DrawFn, url: str) -> tuple[dict[str, Any], Shape]:
    kind = draw(st.sampled_from(["integer", "number", "string", "boolean", "date", "date-time", "enum", "const"]))
    if kind == "integer":
        node: dict[str, Any] = {"type": "integer"}
        if draw(st.booleans()):
            node["minimum"] = draw(st.integers(-5, 5))
        if draw(st.booleans()):
            node["multipleOf"] = draw(st.sampled_from([2, 3]))
        return node, "long"
    if kind == "number":
        node = {"type": "number"}
        if draw(st.booleans()):
            node["maximum"] = draw(st.floats(-10, 1e6))
        return node, "double"
    if kind == "string":
        node = {"type": "string"}
        if draw(st.booleans()):
            node["maxLength"] = draw(st.integers(0, 5))
        if draw(st.booleans()):
            node["pattern"] = "^[a-c]*$"
        return node, "string"
    if kind == "boolean":
        return {"type": "boolean"}, "boolean"
    if kind in ("date", "date-time"):
        return {"type": "string", "format": kind}, "date" if kind == "date" else "timestamp"
    if kind == "enum":
        if draw(st.booleans()):
            return {"enum": draw(st.lists(st.sampled_from(["A", "B", "é", ""]), min_size=1, unique=True))}, "string"
        return {"enum": draw(st.lists(st.integers(-3, 3), min_size=1, unique=True))}, "long"
    return {"const": draw(st.sampled_from(["A", "x"]))}, "string"


@st.composite
def nodes(draw: st.DrawFn, url: str, defs: dict[str, Any], depth: int = 0) -> tuple[dict[str, Any], Shape]:
    choice = draw(st.sampled_from(["leaf"] * 4 + ["object", "map", "array", "oneOf", "ref"] * (depth < 3)))
    if choice == "leaf":
        node, shape = draw(leaves(url))
    elif choice == "object":
        node, shape = draw(objects(url, defs, depth + 1))
    elif choice == "map":
        value, child = draw(nodes(url, defs, depth + 1))
        if draw(st.booleans()):
            node = {"type": "object", "additionalProperties": value}
        else:
            node = {"type": "object", "patternProperties": {"^[a-z]+$": value}, "additionalProperties": False}
        shape = ("map", child)
    elif choice == "array":
        item, child = draw(nodes(url, defs, depth + 1))
        node, shape = {"type": "array", "items": item}, ("array", child)
        if draw(st.booleans()):
            node["maxItems"] = 3
    elif choice == "oneOf":
        a, b = draw(st.sampled_from([(2, 3), (2, 4), (3, 5)]))
        key = draw(st.sampled_from(["oneOf", "anyOf"]))
        node = {key: [{"type": "integer", "multipleOf": a}, {"type": "integer", "multipleOf": b}]}
        shape = "long"
    else:
        target, shape = draw(nodes(url, defs, depth + 1))
        name = f"D{len(defs)}"
        defs[name] = target
        node = {"$ref": f"#/{'$defs' if url in (D2019, D2020) else 'definitions'}/{name}"}
    if draw(st.integers(0, 3)) == 0:  # nullable, as a type list or as anyOf with null
        if isinstance(node.get("type"), str) and draw(st.booleans()):
            node = {**node, "type": [node["type"], "null"]}
        else:
            node = {"anyOf": [node, {"type": "null"}]}
    return node, shape


@st.composite
def objects(draw: st.DrawFn, url: str, defs: dict[str, Any], depth: int) -> tuple[dict[str, Any], Shape]:
    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    children = {n: draw(nodes(url, defs, depth)) for n in names}
    node: dict[str, Any] = {"type": "object", "properties": {n: c[0] for n, c in children.items()}}
    required = draw(st.lists(st.sampled_from(names), unique=True))
    if required:
        node["required"] = required
    extra = draw(st.sampled_from(["absent", "false", "true", "schema"]))
    if extra != "absent":
        node["additionalProperties"] = {"false": False, "true": True, "schema": {"type": "integer"}}[extra]
    if draw(st.integers(0, 3)) == 0:
        node["patternProperties"] = {"^q": {"type": "string"}}
    return node, ("struct", {n: c[1] for n, c in children.items()})


@st.composite
def schemas(draw: st.DrawFn) -> tuple[dict[str, Any], Shape]:
    url = draw(st.sampled_from([D4, D6, D7, D2019, D2020]))
    defs: dict[str, Any] = {}
    root, shape = draw(objects(url, defs, 0))
    doc = {"$schema": url, **root}
    if defs:
        doc["$defs" if url in (D2019, D2020) else "definitions"] = defs
    return doc, shape


EDGE_FLOATS = [0.0, -0.0, 1.5, 1e308, -1e-308, 5e-324, float("nan"), float("inf"), float("-inf")]
EDGE_INTS = [0, 7, -(2**63), 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 2**53 + 1, 10**30]


def _date_time_text(draw: st.DrawFn) -> str:
    at = draw(st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)))
    text = at.strftime("%Y-%m-%dT%H:%M:%S")
    digits = draw(st.sampled_from(["", ".5", ".123456", ".1234567", ".120000000", f".{at.microsecond:06d}"]))
    zone = draw(st.sampled_from(["Z", "z", "+00:00", "-23:59", "+05:30", ""]))
    text = text + digits + zone
    mutation = draw(st.sampled_from(["none"] * 6 + ["lower", "space", "leap", "bad-day"]))
    if mutation == "lower":
        text = text.lower()
    elif mutation == "space":
        text = text.replace("T", " ")
    elif mutation == "leap":
        text = text[:17] + "60" + text[19:]
    elif mutation == "bad-day":
        text = text[:8] + "31" + text[10:]
    return text


@st.composite
def instances(draw: st.DrawFn, shape: Shape, depth: int = 0) -> Any:
    # Rare events are a middle value of a range: hypothesis draws a range's ends far more often than 1 in n.
    if draw(st.integers(1, 40)) == 17:  # a value of another kind, anywhere
        return draw(st.sampled_from([None, 1, -1.5, "s", True, [], {}, 7.0]))
    if isinstance(shape, tuple):
        kind, child = shape
        if kind == "struct":
            out = {n: draw(instances(s, depth + 1)) for n, s in child.items() if draw(st.integers(0, 5))}
            if draw(st.integers(1, 10)) == 7:
                out[draw(st.sampled_from(["extra", "q1", "zz"]))] = draw(st.sampled_from([1, "v", None]))
            return out
        if kind == "map":
            keys = draw(st.lists(st.sampled_from(["k", "abc", "Up", "x1", ""]), max_size=3, unique=True))
            return {k: draw(instances(child, depth + 1)) for k in keys}
        return [draw(instances(child, depth + 1)) for _ in range(draw(st.integers(0, 4)))]
    if shape == "long":
        return draw(st.one_of(st.integers(-10, 10), st.sampled_from(EDGE_INTS),
                              st.integers(-10, 10).map(float), st.sampled_from([2.0**63, 1e20, 0.5])))  # fmt: skip
    if shape == "double":
        return draw(st.one_of(st.floats(), st.sampled_from(EDGE_FLOATS), st.sampled_from(EDGE_INTS)))
    if shape == "string":
        return draw(st.one_of(st.text(max_size=6), st.sampled_from(["A", "B", "abc", "é", "", "x" * 100_000])))
    if shape == "boolean":
        return draw(st.booleans())
    if shape == "date":
        odd = st.sampled_from(["2026-02-30", "2026-1-01", "0000-01-01"])
        return draw(st.one_of(st.dates().map(dt.date.isoformat), odd))
    return _date_time_text(draw)


def _body(draw: st.DrawFn, doc: Any) -> bytes:
    text = json.dumps(doc).encode()  # allow_nan: NaN and Infinity, as json.dumps (and JSONSerializer) writes them
    damage = draw(st.integers(1, 40))
    if damage == 17:
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]  # cut short
    if damage == 23:
        return text[:1] + b"\xff" + text[1:]  # not UTF-8
    return text


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_differential_tidemark_publishes_exactly_what_jsonschema_accepts_with_json_loads_values(data: Any) -> None:
    schema, shape = data.draw(schemas())
    c = checker(schema)
    reference = oracle_validator(schema)
    COUNTS["schemas"] += 1
    for _ in range(INSTANCES):
        body = _body(data.draw, data.draw(instances(shape)))
        got = c.check(PREFIX + body)
        verdict, expected = oracle(reference, shape, body)
        COUNTS["cases"] += 1
        assert_same_verdict(verdict, expected, got, (schema, body))


def oracle(reference: Any, shape: Shape, body: bytes) -> tuple[str, Any]:
    """What the reference readers say of ``body``: ``("published", values)``, or why not: ``undecodable`` (not
    UTF-8 or not JSON to ``json.loads``), ``invalid`` (``jsonschema`` refuses it), ``unfit`` (valid, but a value
    its column cannot hold exactly)."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except ValueError:
        return "undecodable", None
    if not reference.is_valid(doc):
        return "invalid", None
    try:
        return "published", oracle_values(doc, shape)
    except Unfit:
        return "unfit", None


def assert_same_verdict(verdict: str, expected: Any, got: dict[str, Any], case: Any) -> None:
    """Tidemark's decoding ``got`` (its values and :data:`REASON`) agrees with the oracle's ``verdict``."""
    why = got.get(REASON)
    COUNTS[verdict] = COUNTS.get(verdict, 0) + 1
    if verdict == "published":
        assert why is None, case
        assert _same({k: v for k, v in got.items() if k != REASON}, expected), (case, got, expected)
        return
    assert why is not None, (case, got)
    if verdict == "undecodable":
        assert why.endswith(("is not valid UTF-8", "is not JSON (RFC 8259, as json.loads reads it)")), (case, why)
    elif verdict == "unfit":
        assert "is valid under the reader JSON Schema but is not" in why, (case, why)
    else:
        assert "is valid under the reader JSON Schema" not in why and "JSON (RFC 8259" not in why, (case, why)
        COUNTS["named_no_field"] += why.endswith("is not valid under the reader JSON Schema")


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Any:
    yield
    if COUNTS["schemas"]:
        print(f"\njson_schema differential: {COUNTS}")  # the run's note needs the counts


def test_references_the_workers_could_not_resolve_are_found_anywhere_in_a_schema() -> None:
    from tidemark.spark.json_schema import _outside_refs

    doc = obj(
        {"a": {"$ref": "#/$defs/A"}, "b": {"not": {"$ref": "other.json#/X"}}, "c": {"enum": [{"$ref": "x"}]},
         "d": {"not": {"$ref": "#/$defs/B"}}, "e": {"$ref": "#anchor"}},
        allOf=[{"$ref": "https://example.com/s.json"}], **{"$defs": {"A": {"type": "string"}}},
    )  # fmt: skip
    assert _outside_refs(doc) == ["'other.json#/X'", "'#/$defs/B'", "'#anchor'", "'https://example.com/s.json'"]


def test_a_recursive_writer_schema_names_its_first_levels_and_gives_the_general_reason_below() -> None:
    node = {"type": "object", "properties": {"name": {"type": "string"}, "left": {"$ref": "#/$defs/N"},
                                             "right": {"$ref": "#/$defs/N"}}}  # fmt: skip
    reader = obj({"id": {"type": "integer"}})
    writer = obj({"id": {"type": "integer"}, "tree": {"$ref": "#/$defs/N"}}, **{"$defs": {"N": node}})
    schemas = JsonSchemas("json_schema", "s", 2, 8, (7, 8), reader=json.dumps(reader),
                          writers=((7, json.dumps(writer)),))  # fmt: skip
    assert len(schemas.reasons()) < 40  # a tree of two branches, not 2**32 walks
    c = RecordChecker(schemas)
    assert c.check(PREFIX + b'{"tree": {"name": 1}}')[REASON] == (
        "value field 'tree.name' breaks its writer JSON Schema (id 7): 'type': \"string\""
    )
    deep = b'{"tree": {"left": {"right": {"left": {"name": 1}}}}}'
    assert c.check(PREFIX + deep)[REASON] == "value is not valid under its writer JSON Schema (id 7)"


def test_a_failure_inside_the_worker_names_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    from tidemark.errors import SchemaError
    from tidemark.spark import json_schema

    def broken(self: RecordChecker, framed: bytes) -> dict[str, Any]:
        raise KeyError("boom")

    monkeypatch.setattr(RecordChecker, "check", broken)
    schema = json.dumps(obj({"id": {"type": "integer"}}))
    decode = json_schema._decoder(JsonSchemas("json_schema", "s", 1, 7, (7,), reader=schema), "p", pa.null(), "value")
    batch = pa.RecordBatch.from_pydict({"topic": ["orders"], "partition": [3], "offset": [41], "value": [b"x"]})
    with pytest.raises(SchemaError, match=r"orders\[3\] offset 41: checking its value .* \(KeyError: 'boom'\)"):
        list(decode(iter([batch])))


def test_a_writer_field_the_reader_forbids_is_named_in_the_reason() -> None:
    name = {"name": {"type": "string"}}
    reader = obj({"id": {"type": "integer"}, "who": {"type": "object", "properties": name,
                                                     "additionalProperties": False}},
                 additionalProperties=False)  # fmt: skip
    writer = obj({"id": {"type": "integer"}, "note": {"type": "string"},
                  "who": {"type": "object", "properties": {**name, "age": {"type": "integer"}}}})  # fmt: skip
    schemas = JsonSchemas("json_schema", "s", 2, 8, (7, 8), reader=json.dumps(reader),
                          writers=((7, json.dumps(writer)),))  # fmt: skip
    c = RecordChecker(schemas)
    assert c.check(PREFIX + b'{"id": 1, "note": "n"}')[REASON] == (
        "value has property 'note', which the reader JSON Schema does not allow ('additionalProperties': false)"
    )
    assert c.check(PREFIX + b'{"id": 1, "who": {"name": "a", "age": 3}}')[REASON] == (
        "value field 'who' has property 'age', which the reader JSON Schema does not allow ('additionalProperties': "
        "false)"
    )
    # A name no schema knows is data: the reason names the object and what it allows.
    assert c.check(PREFIX + b'{"id": 1, "zz9": 0}')[REASON] == (
        "value has a property the reader JSON Schema does not allow ('additionalProperties': false; it allows only "
        "id, who)"
    )
