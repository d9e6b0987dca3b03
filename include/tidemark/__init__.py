"""Tidemark: batch Kafka consumption and offset replay on Airflow and PySpark.

The library behind the DAGs, the plugin's view, the Spark job and the ``tidemark`` CLI,
in layers that ``make lint`` checks (``docs/ARCHITECTURE.md``): feed configs
(``config``); the pure offset planner (``planning``) beside the Kafka adapter
(``kafka``) and Tidemark's own checkpoint store (``checkpoints``); the Spark data source
and decoders (``spark``); validation and the outputs, Parquet and Iceberg
(``validation``, ``output``); the spark-submit program (``job``); one run outside Spark
and its commit protocol (``runs``); then Airflow (``orchestration``, the only layer that
imports Airflow), the view (``web``), the local stand-ins for the demo (``devtools``:
the embedded Kafka cluster, a schema registry, a local Airflow) and the CLI (``cli``).
Core leaves under all of them: ``errors``, ``faults``, ``storage``, ``settings``,
``redaction`` and ``_types``. Importing this package imports nothing else.
"""

from __future__ import annotations

__version__ = "0.1.0"
