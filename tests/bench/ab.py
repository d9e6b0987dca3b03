"""Side-by-side A/B of ``tidemark run`` variants: ``python -m tests.bench.ab SIZE ROUNDS VARIANT...``.

A variant is ``name=[CODE_DIR][:KEY=VALUE,...]``: ``CODE_DIR`` is a copy of the project
(``git archive <commit> include spark_jobs | tar -x -C CODE_DIR``) whose ``include/``
and ``spark_jobs/tidemark_job.py`` the run uses instead of the installed ones (empty: the
installed code), and the pairs are extra environment variables, e.g.
``SPARK_CONF_DIR=/tmp/conf`` for a ``spark-defaults.conf``. Every round produces SIZE
records of the demo feed's shape per variant and runs each variant once, in turn,
reversing the order every other round; round 0 is a warm-up and is dropped. Printed per
variant: median wall seconds, median CPU seconds (user + sys of the run's process tree:
the CLI, ``spark-submit``'s JVM and the Python driver; steadier than wall time on a shared
machine) and the job's step timings, with the ratio to the first variant.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.small import FEED, SmallRunBench
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.errors import TidemarkError


def parse_variant(spec: str) -> tuple[str, str, dict[str, str]]:
    name, _, rest = spec.partition("=")
    code, _, pairs = rest.partition(":")
    env = dict(kv.split("=", 1) for kv in pairs.split(",") if kv)
    return name, code, env


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3:
        print(__doc__)
        return 2
    size, rounds = int(args[0]), int(args[1])
    variants = [parse_variant(v) for v in args[2:]]
    bench = SmallRunBench(connection_from_env(), Path(tempfile.mkdtemp(prefix="tidemark-ab-")), print)
    wall: dict[str, list[float]] = {v[0]: [] for v in variants}
    cpu: dict[str, list[float]] = {v[0]: [] for v in variants}
    steps: dict[str, list[dict[str, float]]] = {v[0]: [] for v in variants}
    for round_no in range(rounds + 1):
        for name, code, extra in variants if round_no % 2 == 0 else list(reversed(variants)):
            bench.produce(size)
            env = {**bench.env, **extra}
            if code:
                env["PYTHONPATH"] = f"{code}/include"
                env["TIDEMARK_SPARK_JOB"] = f"{code}/spark_jobs/tidemark_job.py"
            before = set(bench._run_dirs())
            used = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "tidemark.cli", "run", FEED], env=env, capture_output=True,
                                  text=True, check=False)  # fmt: skip
            seconds = time.monotonic() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_s = after.ru_utime - used.ru_utime + after.ru_stime - used.ru_stime
            if proc.returncode != 0:
                raise TidemarkError(f"variant {name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            (run_dir,) = set(bench._run_dirs()) - before
            job = json.loads((run_dir / "job.json").read_text())
            if job["records_read"] != size:
                raise TidemarkError(f"variant {name} read {job['records_read']} records, expected {size}")
            print(f"round {round_no or 'warm-up'} {name}: {seconds:.2f}s, cpu {cpu_s:.1f}s, steps {job['timings_s']}",
                  flush=True)  # fmt: skip
            if round_no:
                wall[name].append(seconds)
                cpu[name].append(cpu_s)
                steps[name].append({k: float(v) for k, v in job["timings_s"].items()})
    first = variants[0][0]
    for name, _, _ in variants:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        step = {k: round(statistics.median(d.get(k, 0.0) for d in steps[name]), 2) for k in steps[name][0]}
        print(f"{name}: wall {w:.2f}s {[round(x, 1) for x in wall[name]]} ({w / statistics.median(wall[first]):.3f}), "
              f"cpu {c:.1f}s {[round(x, 1) for x in cpu[name]]} ({c / statistics.median(cpu[first]):.3f}), "
              f"steps {step}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
