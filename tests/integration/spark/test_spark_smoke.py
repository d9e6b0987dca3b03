"""A local SparkSession runs and reads a Python data source (the API the reader uses)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_spark_reads_a_python_data_source(spark: Any) -> None:
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Squares(DataSource):
        @classmethod
        def name(cls) -> str:
            return "tidemark_smoke_squares"

        def schema(self) -> str:
            return "n long, sq long"

        def reader(self, schema: Any) -> DataSourceReader:
            return SquaresReader()

    class SquaresReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(3)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            base = partition.value * 10
            ns = list(range(base, base + 10))
            yield pa.RecordBatch.from_pydict({"n": ns, "sq": [n * n for n in ns]})

    spark.dataSource.register(Squares)
    df = spark.read.format("tidemark_smoke_squares").load()
    rows = sorted((r.n, r.sq) for r in df.collect())
    assert rows == [(n, n * n) for n in range(30)]
    assert df.rdd.getNumPartitions() == 3
