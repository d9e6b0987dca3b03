"""The pinned stack is the one we think it is (guards the pyspark-client trap)."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pyspark


def test_pyspark_python_side_matches_its_jars() -> None:
    jars = Path(pyspark.__file__).parent / "jars"
    core = [p.name for p in jars.glob("spark-core_*.jar")]
    assert core, f"no spark-core jar under {jars}"
    assert core[0].endswith(f"-{pyspark.__version__}.jar"), (core, pyspark.__version__)
    assert pyspark.__version__.startswith("4.3.")


def test_pinned_versions() -> None:
    assert version("apache-airflow").startswith("3.3.")
    assert version("confluent-kafka").startswith("2.16.")
    assert version("great-expectations").startswith("1.")
