"""DAG parse benchmark: how long Airflow takes to parse Tidemark's DAG files for 1, 10 and 100 feed files.

For each count, writes that many valid feed files (and, with ``--bad``, one malformed file
beside them) to a temporary feeds folder and parses ``dags/tidemark_dags.py`` and
``dags/tidemark_feed_errors.py`` as the DAG processor does, with Airflow's own
``DagBag.process_file``: *warm* in one process with the modules already imported (what
``[dag_processor] parsing_pre_import_modules``, on by default, gives each parse) and
*cold* in a fresh interpreter (the first parse after a start, imports included). Prints
the medians, the DAGs found and the network connections tried while parsing, which must
be zero: no Kafka or registry call at parse time. Airflow's ``dagbag_import_timeout``
default is 30 s. Not a test (a unit test must not assert timing): ``make bench-dagparse``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = (ROOT / "dags" / "tidemark_dags.py", ROOT / "dags" / "tidemark_feed_errors.py")
IMPORT_TIMEOUT_S = 30.0  # Airflow's [core] dagbag_import_timeout default

_COLD = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1], collect_dags=False)
took = {}
for path in sys.argv[2:]:
    start = time.perf_counter()
    bag.process_file(path, only_if_updated=False)
    took[path] = time.perf_counter() - start
print(json.dumps(took))
"""


def write_feeds(folder: Path, count: int, bad: bool) -> None:
    for i in range(count):
        output = folder.parent / "out" / str(i)
        text = f"topics: [bench-{i}]\ngroup: g-bench-{i}\noutput: {output}\nschedule: '@hourly'\n"
        (folder / f"bench_{i:03d}.yaml").write_text(text)
    if bad:
        (folder / "broken.yaml").write_text("topics: [orders\ngroup: g-broken\n")


class _NoNetwork:
    """Counts (and refuses) every outgoing connection while installed: parsing must not call Kafka or a registry."""

    def __init__(self) -> None:
        self.tried: list[Any] = []
        self._connect = socket.socket.connect

    def __enter__(self) -> _NoNetwork:
        def refuse(sock: socket.socket, address: Any) -> None:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                self.tried.append(address)
                raise ConnectionRefusedError(f"no network at parse time: {address}")
            self._connect(sock, address)

        socket.socket.connect = refuse  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        socket.socket.connect = self._connect  # type: ignore[method-assign]


def warm(folder: Path, samples: int) -> tuple[dict[str, float], set[str], dict[str, str], int]:
    from airflow.dag_processing.dagbag import DagBag

    took: dict[str, list[float]] = {p.name: [] for p in DAG_FILES}
    with _NoNetwork() as guard:
        for _ in range(samples + 1):  # the first round imports the modules: not counted
            bag = DagBag(dag_folder=str(folder), collect_dags=False)
            for path in DAG_FILES:
                start = time.perf_counter()
                bag.process_file(str(path), only_if_updated=False)
                took[path.name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t[1:]) for name, t in took.items()}
    errors = {Path(k).name: v.count("load no DAG") for k, v in bag.import_errors.items()}
    return medians, set(bag.dag_ids), errors, len(guard.tried)


def cold(folder: Path, samples: int) -> dict[str, float]:
    took: dict[str, list[float]] = {p.name: [] for p in DAG_FILES}
    for _ in range(samples):
        out = subprocess.run(
            [sys.executable, "-c", _COLD, str(folder), *map(str, DAG_FILES)],
            check=True, capture_output=True, text=True, env=os.environ.copy(),
        )  # fmt: skip
        for path, seconds in json.loads(out.stdout.strip().splitlines()[-1]).items():
            took[Path(path).name].append(seconds)
    return {name: statistics.median(t) for name, t in took.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.dagparse", description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,10,100", help="feed file counts, comma-separated")
    parser.add_argument("--samples", type=int, default=7, help="warm parses per count")
    parser.add_argument("--cold-samples", type=int, default=3, help="fresh-interpreter parses per count")
    parser.add_argument("--bad", action="store_true", help="add one malformed feed file beside the good ones")
    args = parser.parse_args(argv)

    home = Path(tempfile.mkdtemp(prefix="tidemark-dagparse-"))
    # --bad makes the errors file fail to import, each parse: Airflow would log it every time, over the table.
    os.environ.update(AIRFLOW_HOME=str(home / "airflow"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
                      AIRFLOW__LOGGING__LOGGING_LEVEL="CRITICAL")  # fmt: skip
    print(f"{'feeds':>5} {'DAGs':>5} {'warm dags.py':>13} {'warm errors.py':>15} {'cold dags.py':>13} "
          f"{'cold errors.py':>15} {'connections':>11}  import errors (file: bad feeds named)")  # fmt: skip
    worst = 0.0
    for count in (int(c) for c in args.counts.split(",")):
        folder = home / f"feeds-{count}"
        folder.mkdir()
        write_feeds(folder, count, args.bad)
        os.environ["TIDEMARK_FEEDS_DIR"] = str(folder)
        medians, dag_ids, errors, tried = warm(folder, args.samples)
        first = cold(folder, args.cold_samples)
        worst = max(worst, *first.values())
        dags_py, errors_py = (p.name for p in DAG_FILES)
        print(f"{count:>5} {len(dag_ids):>5} {medians[dags_py]:>12.3f}s {medians[errors_py]:>14.3f}s "
              f"{first[dags_py]:>12.3f}s {first[errors_py]:>14.3f}s {tried:>11}  {errors or 'none'}")  # fmt: skip
        if tried:
            print(f"parsing tried {tried} network connection(s): the DAG files must not call Kafka or a registry")
            return 1
    print(f"slowest cold parse {worst:.2f}s against Airflow's default dagbag_import_timeout of {IMPORT_TIMEOUT_S:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
