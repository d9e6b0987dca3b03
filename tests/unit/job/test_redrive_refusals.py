"""A re-drive refuses, naming the feed, the feeds whose dead letters it cannot decode again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.config.models import load_feed_file
from tidemark.errors import ConfigError
from tidemark.job.redrive import refuse_unsupported, schema_id_of

BASE = (
    "topics: [orders]\ngroup: orders-batch\ndeserialization:\n  format: json\n  fields: [{name: email, type: string}]\n"
)


def test_a_masked_feed_without_keep_raw_is_refused_naming_the_feed_and_what_to_set(tmp_path: Path) -> None:
    (tmp_path / "orders.yaml").write_text(BASE + "masking:\n  fields: {email: redact}\n")
    with pytest.raises(ConfigError) as refused:
        refuse_unsupported(load_feed_file(tmp_path / "orders.yaml"))
    message = str(refused.value)
    assert "feed 'orders'" in message and "no raw bytes" in message
    assert "set masking.keep_raw" in message
    assert "only dead letters quarantined after" in message


def test_a_masked_feed_with_keep_raw_may_be_redriven(tmp_path: Path) -> None:
    (tmp_path / "orders.yaml").write_text(
        BASE + f"masking:\n  fields: {{email: redact}}\n  keep_raw: {tmp_path / 'raw'}\n"
    )
    refuse_unsupported(load_feed_file(tmp_path / "orders.yaml"))


def test_an_unmasked_json_feed_may_be_redriven(tmp_path: Path) -> None:
    (tmp_path / "orders.yaml").write_text(BASE)
    refuse_unsupported(load_feed_file(tmp_path / "orders.yaml"))


def test_a_keyed_table_feed_is_refused_naming_the_feed_and_why(tmp_path: Path) -> None:
    (tmp_path / "orders.yaml").write_text(
        BASE.replace("type: string}", "type: string, required: false}")
        + "output_format: iceberg\niceberg: {mode: upsert, key: email, change_format: state}\n"
    )
    with pytest.raises(ConfigError, match=r"feed 'orders' writes a keyed table .*skipped as stale"):
        refuse_unsupported(load_feed_file(tmp_path / "orders.yaml"))


@pytest.mark.parametrize("fmt", ["avro", "protobuf", "json_schema"])
def test_every_registry_format_may_be_redriven(tmp_path: Path, fmt: str) -> None:
    (tmp_path / "orders.yaml").write_text(
        f"topics: [orders]\ngroup: orders-batch\ndeserialization:\n  format: {fmt}\n  key_format: {fmt}\n"
    )
    refuse_unsupported(load_feed_file(tmp_path / "orders.yaml"))


@pytest.mark.parametrize(
    ("raw", "schema_id"),
    [(b"\x00\x00\x00\x01\x2c\x02", 300), (b"\x00\x00\x00\x00\x07", 7), (b"\x00\x00\x00\x07", None),
     (b"\x01\x00\x00\x00\x07\x02", None), (b"", None), (None, None)],
)  # fmt: skip
def test_the_schema_id_of_a_dead_letters_raw_bytes_is_their_wire_format_headers(
    raw: bytes | None, schema_id: int | None
) -> None:
    assert schema_id_of(raw) == schema_id
