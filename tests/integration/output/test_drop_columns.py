"""Publishing good records without the job's own columns: a copy of the other columns' chunks, not a rewrite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tidemark.errors import PublishError
from tidemark.output.parquet import drop_columns
from tidemark.spark.arrow_avro import SPARK_SCHEMA_KEY

pytestmark = pytest.mark.spark

DROPPED = ["_row_hash", "_raw_value"]


def _staged(spark: Any, folder: Path) -> Any:
    """Records of the shapes the job stages: nested, repeated, decimal and time columns, two small row groups per
    file, partitioned like the staging (the dropped columns in the middle and at the end)."""
    from pyspark.sql import functions as F

    df = spark.range(0, 30_000, numPartitions=2).select(
        (F.col("id") % 2).cast("string").alias("topic"),
        F.col("id").alias("offset"),
        F.xxhash64("id").alias("_row_hash"),
        F.struct((F.col("id") * 7).alias("n"), F.concat(F.lit("c-"), F.col("id").cast("string")).alias("s"))
        .alias("customer"),
        F.array(F.col("id"), F.col("id") + 1).alias("items"),
        F.create_map(F.lit("k"), F.col("id").cast("string")).alias("tags"),
        (F.col("id") / 100).cast("decimal(10,2)").alias("amount"),
        F.timestamp_millis(F.lit(1_767_225_600_000) + F.col("id")).alias("at"),
        F.when(F.col("id") % 1000 == 0, F.concat(F.lit(b"\x00raw"), F.col("id").cast("string").cast("binary")))
        .alias("_raw_value"),
    )  # fmt: skip
    df.write.option("parquet.block.size", 64 * 1024).partitionBy("topic").parquet(str(folder))
    return spark.read.parquet(str(folder))


def test_the_copies_hold_every_other_column_as_spark_wrote_it(spark: Any, tmp_path: Path) -> None:
    source, target = tmp_path / "staged", tmp_path / "published"
    staged = _staged(spark, source)
    files = sorted(p.relative_to(source) for p in source.rglob("*.parquet"))

    assert drop_columns(str(source), target, DROPPED) == len(files)
    assert sorted(p.relative_to(target) for p in target.rglob("*.parquet")) == files

    # Spark takes a file's schema from its footer's Spark schema: the copies' lacks the dropped columns.
    copied = spark.read.parquet(str(target))
    assert copied.schema == staged.drop(*DROPPED).schema
    assert copied.orderBy("offset").collect() == staged.drop(*DROPPED).orderBy("offset").collect()

    for name in files:
        before, after = pq.ParquetFile(source / name).metadata, pq.ParquetFile(target / name).metadata
        assert set(pq.read_schema(source / name).names) - set(pq.read_schema(target / name).names) == set(DROPPED)
        assert after.num_rows == before.num_rows and after.num_row_groups == before.num_row_groups > 1
        spark_schema = json.loads(after.metadata[SPARK_SCHEMA_KEY.encode()])
        assert DROPPED[0] not in {f["name"] for f in spark_schema["fields"]}
        for g in range(before.num_row_groups):
            kept = {before.row_group(g).column(c).path_in_schema: before.row_group(g).column(c)
                    for c in range(before.num_columns)
                    if before.row_group(g).column(c).path_in_schema.split(".")[0] not in DROPPED}  # fmt: skip
            copies = {after.row_group(g).column(c).path_in_schema: after.row_group(g).column(c)
                      for c in range(after.num_columns)}  # fmt: skip
            assert list(copies) == list(kept)
            for path, chunk in copies.items():  # the same bytes: sizes, encodings, statistics, page indexes
                was = kept[path]
                assert (chunk.total_compressed_size, chunk.encodings, chunk.compression) == (
                    was.total_compressed_size, was.encodings, was.compression
                )  # fmt: skip
                assert chunk.statistics == was.statistics
                assert (chunk.has_column_index, chunk.has_offset_index) == (was.has_column_index, was.has_offset_index)
        assert pq.read_table(target / name).equals(pq.read_table(source / name).drop_columns(DROPPED))


def test_a_folder_without_parquet_files_copies_nothing(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "staged").mkdir()
    (tmp_path / "staged" / "_SUCCESS").write_text("")
    assert drop_columns(str(tmp_path / "staged"), tmp_path / "published", DROPPED) == 0
    assert not (tmp_path / "published").exists()


def test_a_staged_file_that_is_not_parquet_fails_the_copy_naming_it(spark: Any, tmp_path: Path) -> None:
    broken = tmp_path / "staged" / "topic=t" / "part-00000.parquet"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"PAR1 but no footer")
    with pytest.raises(
        PublishError,
        match=r"staged file .*topic=t/part-00000\.parquet cannot be read as Parquet: "
        r"java\.lang\.RuntimeException: .*not a Parquet file",
    ) as caught:
        drop_columns(str(tmp_path / "staged"), tmp_path / "published", DROPPED)
    assert "\tat " not in str(caught.value)  # the reason, not the JVM's stack
