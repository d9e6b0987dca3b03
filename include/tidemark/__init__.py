"""Tidemark: batch Kafka consumption and offset replay on Airflow and PySpark.

The library behind the DAGs, the Spark jobs and the ``tidemark`` CLI: the embedded
local Kafka cluster, feed configs, the offset planner, the Spark data source, the sink,
validation and the commit protocol. Nothing here imports Airflow at module top level.
"""

from __future__ import annotations

__version__ = "0.1.0"
