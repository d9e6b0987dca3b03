"""A Spark configuration folder whose applications write a plain-text event log: what Spark's UI and history show."""

from __future__ import annotations

from pathlib import Path


def event_log_conf(tmp_path: Path) -> tuple[Path, Path]:
    """``(conf_dir, events)``: set ``SPARK_CONF_DIR`` to the first, and every application started under it writes its
    event log, uncompressed and in one file, into the second, to be searched."""
    conf_dir, events = tmp_path / "spark-conf", tmp_path / "spark-events"
    conf_dir.mkdir()
    events.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir {events}\n"
        "spark.eventLog.compress false\nspark.eventLog.rolling.enabled false\n"
    )
    return conf_dir, events
