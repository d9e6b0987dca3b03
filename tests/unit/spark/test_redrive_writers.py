"""A re-drive's JSON Schema writers that do not resolve: their records' reasons name the schema id, and a record
not in the wire format is not checked against the reader alone (:class:`tidemark.spark.json_schema.RecordChecker`)."""

from __future__ import annotations

import json

import pytest

from tidemark.spark.json_schema import REASON, JsonSchemas, RecordChecker

READER = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]})
GONE = "value was written with schema id 9, which the schema registry does not have"
UNFRAMED = "value is not in the Schema Registry wire format (magic byte 0, a 4-byte schema id)"


def redrive_checker() -> RecordChecker:
    return RecordChecker(JsonSchemas("json_schema", "s-value", 1, 7, (7,), reader=READER, writers=((7, READER),),
                                     unresolved=((9, GONE),), unframed=UNFRAMED))  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "reason"),
    [(b"\x00\x00\x00\x00\x07" + b'{"id": 1}', None),
     (b"\x00\x00\x00\x00\x09" + b'{"id": 1}', GONE),
     (b"\x01\x00\x00\x00\x07" + b'{"id": 1}', UNFRAMED),
     (b'{"id"', UNFRAMED)],
    ids=["known-writer", "unresolved-writer", "another-magic", "short"],
)  # fmt: skip
def test_a_redrives_record_of_an_unresolved_writer_or_not_framed_fails_with_its_own_reason(
    raw: bytes, reason: str | None
) -> None:
    checker = redrive_checker()
    assert checker.check(raw)[REASON] == reason
    schemas = JsonSchemas("json_schema", "s-value", 1, 7, (7,), reader=READER, writers=((7, READER),),
                          unresolved=((9, GONE),), unframed=UNFRAMED)  # fmt: skip
    assert schemas.reasons()[-2:] == [GONE, UNFRAMED]  # listed, so the job's outcome codes know them


def test_a_runs_schemas_list_no_writer_or_framing_reason() -> None:
    schemas = JsonSchemas("json_schema", "s-value", 1, 7, (7,), reader=READER, writers=((7, READER),))
    assert not [r for r in schemas.reasons() if "schema id" in r or "wire format" in r]
