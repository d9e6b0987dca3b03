"""The reader's pure array helpers: timestamps and repeated strings from buffers, waves of ranges."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tidemark.spark.source import Range, _repeated, _timestamps, _waves


@pytest.mark.parametrize("types", [[1, 1, 1, 1], [1, 0, 2, 0], [0, 0, 0, 0]], ids=["all", "some-missing", "none"])
def test_timestamps_match_a_masked_array(types: list[int]) -> None:
    pairs = np.array([[t, 1_767_225_600_000 + i] for i, t in enumerate(types)], dtype=np.int64).ravel()
    ms, kinds = pairs[1::2], pairs[0::2].astype(np.int32)  # strided views, as the reader has them
    got = _timestamps(ms, kinds)
    expected = pa.array(ms * 1000, type=pa.timestamp("us", tz="UTC"), mask=kinds == 0)
    assert got.equals(expected)
    assert got.null_count == types.count(0)
    got.validate(full=True)


def test_waves_never_assign_one_partition_twice() -> None:
    ranges = [Range("t", 0, 0, 10), Range("t", 1, 0, 5), Range("t", 0, 20, 30), Range("u", 0, 0, 1)]
    waves = _waves(ranges)
    assert waves == [[Range("t", 0, 0, 10), Range("t", 1, 0, 5), Range("u", 0, 0, 1)], [Range("t", 0, 20, 30)]]


@pytest.mark.parametrize(("text", "n"), [("orders.v1", 4), ("", 3), ("naïve-topic", 2), ("t", 0)])
def test_repeated_strings_equal_a_list_built_array(text: str, n: int) -> None:
    got = _repeated(text, n)
    got.validate(full=True)
    assert got.equals(pa.array([text] * n, type=pa.string()))
