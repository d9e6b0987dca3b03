"""The benchmark charts show every measured runner, its value and what its colour means."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from matplotlib.colors import to_hex

from tests.bench import charts


def _runner(name: str, label: str, rate: float, error: str | None = None) -> dict[str, Any]:
    return {"name": name, "label": label, "median_records_per_s": rate, "error": error}


def _read_doc() -> dict[str, Any]:
    runners = [
        _runner("R1", "confluent-kafka consume(N), 1 process", 968_034),
        _runner("R3", "Tidemark Spark read → noop", 798_697),
        _runner("R4", "Spark Kafka source → noop", 0, error="connector jar missing"),
        _runner("R4w", "Spark Kafka source → Parquet", 379_683),
    ]
    return {"runners": {r["name"]: r for r in runners}, "records": 300_000, "value_bytes": 200, "partitions": 8,
            "runs": 5, "cpus": 2, "spark_version": "4.3.0", "spark_master": "local[*]"}  # fmt: skip


def test_read_chart_has_one_labelled_bar_per_measured_runner(tmp_path: Path) -> None:
    fig = charts.read_figure(_read_doc())
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert names == ["R1  confluent-kafka consume(N), 1 process", "R3  Tidemark Spark read → noop",
                     "R4w  Spark Kafka source → Parquet"]  # fmt: skip  # a failed runner has no bar
    values = [t.get_text() for t in ax.texts]
    assert values == ["968,034", "798,697", "379,683"]
    colours = [to_hex(bar.get_facecolor()) for bar in ax.patches[: len(names)]]
    assert colours == [charts.FLOOR, charts.TIDEMARK, charts.SPARK]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [label for _, label in charts.KINDS]
    assert "300,000 records of 200 B from 8 partitions" in ax.get_title()
    charts.save(fig, tmp_path / "read.png")
    assert (tmp_path / "read.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_small_runs_chart_pairs_tidemark_and_spark_per_size() -> None:
    table = [{"records": 0, "tidemark_s": 0.6, "spark_s": 14.3}, {"records": 1000, "tidemark_s": 14.1, "spark_s": 18.8}]
    fig = charts.small_runs_figure({"table": table, "runs": 5, "warmups": 1, "cores": 2})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0 records", "1,000 records"]
    # Tidemark's bars first, then Spark's, each labelled with its seconds.
    assert [t.get_text() for t in ax.texts] == ["0.6 s", "14.1 s", "14.3 s", "18.8 s"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0].startswith("tidemark run") and legend[1].startswith("Spark's Kafka source")


def test_avro_chart_colours_tidemark_and_spark_and_names_the_format() -> None:
    runners = [
        _runner("A3b", "Tidemark Spark read, bytes → noop", 900_000),
        _runner("A3", "Tidemark Spark read, Avro → noop", 700_000),
        _runner("A6", "Tidemark end to end, Avro → Parquet + commit", 300_000),
        _runner("A4w", "Spark Kafka source + from_avro → Parquet", 250_000),
    ]
    doc = {**_read_doc(), "runners": {r["name"]: r for r in runners},
           "what": "Reading and decoding 500,000 Avro records (mean value 48 B, two versions)"}  # fmt: skip
    fig = charts.read_figure(doc)
    ax = fig.axes[0]
    colours = [to_hex(bar.get_facecolor()) for bar in ax.patches[:4]]
    assert colours == [charts.TIDEMARK] * 3 + [charts.SPARK]
    # No floor runner ran: the legend names only the two kinds shown.
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [label for _, label in charts.KINDS[:2]]
    assert ax.get_title().startswith("Reading and decoding 500,000 Avro records (mean value 48 B, two versions)")


def test_every_axis_is_titled_and_the_title_says_when_it_was_measured(tmp_path: Path) -> None:
    read = charts.read_figure({**_read_doc(), "when": "2026-11-24T01:05:18.790340+00:00"}).axes[0]
    assert "measured 2026-11-24 01:05 UTC" in read.get_title()
    assert read.get_xlabel().startswith("records per second") and read.get_ylabel().startswith("runner")
    table = [{"records": 0, "tidemark_s": 0.6, "spark_s": 14.3}]
    doc = {"table": table, "runs": 5, "warmups": 1, "cores": 2, "when": "2026-11-24T02:00:00+01:00"}
    small = charts.small_runs_figure(doc).axes[0]
    assert "measured 2026-11-24 01:00 UTC" in small.get_title()  # in UTC, whatever offset the JSON has
    assert small.get_xlabel() == "records in the run" and small.get_ylabel().startswith("seconds per run")
    assert charts.measured({}) == ""  # an older result without a time: no claim
    (tmp_path / "bench-small.json").write_text(json.dumps(doc))
    assert charts.redraw(tmp_path / "bench-small.json").read_bytes()[:4] == b"\x89PNG"
