"""The range digest recomputed without Spark equals Spark's own (figures pinned from Spark 4.3's ``xxhash64``).

The rows mix null keys, null values, empty and long values (several 32-byte stripes, 8- and
4-byte tails, single bytes), so every branch of XXH64 is taken. The pinned figures were
computed by ``range_stat_aggs`` and ``F.xxhash64`` in a local Spark session.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tidemark.spark.rowhash import range_digest, row_hashes

ROWS = [
    (
        "orders",
        3,
        100 + o,
        None if o % 5 == 0 else f"k{o}".encode(),
        None if o % 7 == 3 else b"v" * (o * 3) + bytes([o]),
    )
    for o in range(40)
]


def columns() -> tuple[np.ndarray, pa.Array, pa.Array]:
    return (np.array([r[2] for r in ROWS]), pa.array([r[3] for r in ROWS], pa.binary()),
            pa.array([r[4] for r in ROWS], pa.binary()))  # fmt: skip


def test_the_digest_equals_sparks() -> None:
    digest = range_digest("orders", 3, *columns())
    assert (digest.records, digest.bytes, digest.checksum) == (40, 2093, "cae30caaae761aa74a0aa9574cde4f0d")


def test_each_rows_hash_equals_sparks_xxhash64() -> None:
    hashes = row_hashes("orders", 3, *columns())
    assert [int(h) for h in hashes[:3]] == [12393969078338523108, 12717809958529039287, 11431614928555320022]


def test_string_columns_hash_as_their_bytes_and_order_does_not_matter() -> None:
    offsets, keys, values = columns()
    as_text = range_digest(
        "orders", 3, offsets, keys, pa.array([r[4] for r in ROWS], pa.binary()).cast(pa.large_binary())
    )
    reversed_ = range_digest("orders", 3, offsets[::-1].copy(), pa.array([r[3] for r in ROWS][::-1], pa.binary()),
                             pa.array([r[4] for r in ROWS][::-1], pa.binary()))  # fmt: skip
    assert as_text == reversed_ == range_digest("orders", 3, offsets, keys, values)


def test_one_byte_changed_or_one_record_less_changes_the_digest() -> None:
    offsets, keys, values = columns()
    changed = [r[4] for r in ROWS]
    changed[9] = (changed[9] or b"")[:-1] + b"\x00"
    base = range_digest("orders", 3, offsets, keys, values)
    assert range_digest("orders", 3, offsets, keys, pa.array(changed, pa.binary())).checksum != base.checksum
    fewer = range_digest("orders", 3, offsets[1:], keys.slice(1), values.slice(1))
    assert fewer.checksum != base.checksum and fewer.records == 39
    assert range_digest("orders", 4, offsets, keys, values).checksum != base.checksum  # another partition
