"""The layers as a running program sees them: what DAG parsing loads, what executors get."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tidemark.job.entry import package_zip

ROOT = Path(__file__).resolve().parents[2]


def test_airflow_view_and_cli_layers_import_without_pyspark() -> None:
    """DAG parsing, the plugin's view and the CLI start without loading Spark (it loads in the job only)."""
    code = (
        "import sys\n"
        "import tidemark.runs.pipeline, tidemark.runs.gather, tidemark.runs.commit, tidemark.runs.report\n"
        "import tidemark.runs.status, tidemark.orchestration.dags, tidemark.web.app\n"
        "import tidemark.cli, tidemark.cli.plan, tidemark.cli.run, tidemark.cli.runs, tidemark.cli.demo\n"
        "from tidemark.cli import build_parser\n"
        "build_parser()\n"
        "print(sorted(m for m in sys.modules if m == 'pyspark' or m.startswith('pyspark.')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout[-2000:]


def test_the_zip_shipped_to_executors_holds_only_what_they_run(tmp_path: Path) -> None:
    target = package_zip(tmp_path)
    names = zipfile.ZipFile(target).namelist()
    tops = {Path(n).parts[1] for n in names if len(Path(n).parts) > 2}  # subpackages of tidemark/
    modules = {Path(n).name for n in names}

    assert tops.isdisjoint({"cli", "devtools", "orchestration", "web", "kafka_local", "s3_local", "templates"}), tops
    assert not any(
        "bench" in m or m.startswith(("pg_local", "spark_local", "s3_local", "airflow_local")) for m in modules
    )
    assert not any(n.endswith((".pyc", "pom.xml", ".html")) for n in names), names
    # What an executor imports comes from the zip itself, first on its path as addPyFile puts it.
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(target)!r})\n"
        "import tidemark.spark.source, tidemark.spark.decode, tidemark.validation.rules, tidemark.output.parquet\n"
        "print(tidemark.spark.source.__file__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith(str(target)), proc.stdout
