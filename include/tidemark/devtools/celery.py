"""Airflow across machines: the CeleryExecutor, its broker and two workers with no shared disk.

``make airflow-celery`` / ``python -m tidemark.devtools.celery up|down``, and the
distributed test (tests/integration/test_celery_workers.py). :class:`CeleryAirflow` is
:class:`~tidemark.devtools.airflow.LocalAirflow` with the CeleryExecutor: the metadata
database, Celery's broker (kombu's SQLAlchemy transport, ``sqla+postgresql+psycopg://``)
and its result backend (``db+postgresql+psycopg://``) all on one PostgreSQL database, so
no broker server is needed; an api-server, a scheduler and a dag-processor on this
machine; and ``workers`` Celery workers, each started as if on a machine of its own:

- its own mount namespace (``unshare -m``) with a fresh tmpfs on ``/tmp`` holding its
  ``AIRFLOW_HOME``, ``HOME`` and everything its tasks write there (staging, Spark's
  scratch), so no task sees a file another worker's task wrote;
- its own UTS namespace (``unshare -u``) named ``tidemark-worker-N``: Airflow records that
  name as the hostname of each task try it runs (``[core] hostname_callable`` is
  ``socket.gethostname``), which is how the test knows where each task ran;
- only what every machine of a deployment has is bound back into its ``/tmp``: the
  installation, the DAGs folder and the feeds folder when they lie under ``/tmp``.

No triggerer: no Tidemark task defers. The workers skip Airflow's log server (a task's log
stays in the worker's own home, ``/proc/<pid>/root/tmp/tidemark-airflow-worker/home/logs``
from outside; a deployment ships logs with remote logging). State and output belong on
an object store and checkpoints in PostgreSQL (``TIDEMARK_STATE_DIR``,
``TIDEMARK_CHECKPOINT_URL`` in ``extra_env`` or the environment): the workers share no
folder. Needs root (``unshare``) and a PostgreSQL database the given URL's user may create
tables in. Nothing here is used by a production deployment: there each worker is a machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tidemark.devtools.airflow import AirflowStartError, LocalAirflow, default_home, project_root
from tidemark.devtools.kafka.cluster import process_runs_as
from tidemark.devtools.processes import alive

DATABASE_URL_ENV = "TIDEMARK_AIRFLOW_DATABASE_URL"
# Inside each worker's own /tmp (a tmpfs of its mount namespace).
WORKER_ROOT = Path("/tmp/tidemark-airflow-worker")
WORKER_PREFIX = "tidemark-worker-"


def driver_url(url: str, scheme: str) -> str:
    """``url`` (``postgresql://`` or ``postgresql+psycopg://``) with ``scheme`` and psycopg 3 as the driver."""
    rest = url.split("://", 1)[1]
    return f"{scheme}://{rest}"


def namespace_script(hostname: str, keep: list[str]) -> str:
    """``sh -c`` text run under ``unshare -m -u`` before ``exec airflow celery worker ...``.

    Names the UTS namespace, puts a fresh tmpfs on ``/tmp``, binds the folders in ``keep``
    (relative to ``/tmp``) back from the covered ``/tmp`` (still reached through the working
    folder), then makes the worker's home there.
    """
    binds = ""
    for k in map(shlex.quote, keep):
        binds += f" && mkdir -p /tmp/{k} && mount --no-canonicalize --bind ./{k} /tmp/{k}"
    home = WORKER_ROOT / "home"
    return (
        f"hostname {shlex.quote(hostname)} && cd /tmp "
        f"&& mount -t tmpfs -o size=2g,mode=1777 tidemark-airflow-worker /tmp{binds} && cd / "
        f'&& mkdir -p {home}/logs && exec "$0" "$@"'
    )


def under_tmp(folders: list[Path]) -> list[str]:
    """The outermost of ``folders`` that lie under ``/tmp``, relative to it (to bind into a worker's /tmp)."""
    found = [f.resolve().relative_to("/tmp") for f in folders if f.resolve().is_relative_to("/tmp")]
    found = [f for f in found if str(f) != "."]
    outermost = [f for f in found if not any(f != o and f.is_relative_to(o) for o in found)]
    return sorted({str(f) for f in outermost})


@dataclass
class CeleryAirflow(LocalAirflow):
    """Airflow with the CeleryExecutor and ``workers`` workers, each in namespaces of its own."""

    home: Path = field(default_factory=lambda: default_home() / "celery")
    database_url: str = field(default_factory=lambda: os.environ.get(DATABASE_URL_ENV, ""))
    workers: int = 2
    concurrency: int = 1  # task slots per worker: 2 cores are shared by everything here
    # queues per worker number (1-based); every worker serves Airflow's default queue unless told here
    queues: dict[int, str] = field(default_factory=dict)
    # seconds without a task's heartbeat before the scheduler fails it (a worker that died): Airflow's default
    heartbeat_timeout_s: int = 300

    def env(self) -> dict[str, str]:
        if not self.database_url:
            raise AirflowStartError(
                f"the Celery shape needs a PostgreSQL database for Airflow's metadata, Celery's broker and its "
                f"results: set {DATABASE_URL_ENV}=postgresql://USER:PASSWORD@HOST:PORT/DB (docs/deploy.md)"
            )
        return {
            **super().env(),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": driver_url(self.database_url, "postgresql+psycopg"),
            # psycopg 3 is async too: Airflow's default async driver (asyncpg) is not in the pinned set.
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": driver_url(self.database_url, "postgresql+psycopg"),
            "AIRFLOW__CELERY__BROKER_URL": driver_url(self.database_url, "sqla+postgresql+psycopg"),
            "AIRFLOW__CELERY__RESULT_BACKEND": driver_url(self.database_url, "db+postgresql+psycopg"),
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.concurrency),
            # The database transport has no broadcast: no remote control, mingle or gossip.
            "AIRFLOW__CELERY__WORKER_ENABLE_REMOTE_CONTROL": "False",
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "socket.gethostname",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(self.heartbeat_timeout_s),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            **self.extra_env,
        }

    def worker_names(self) -> list[str]:
        return [f"worker-{n}" for n in range(1, self.workers + 1)]

    def hostname(self, worker: str) -> str:
        """The hostname Airflow records for the task tries ``worker`` runs."""
        return WORKER_PREFIX + worker.removeprefix("worker-")

    def processes(self) -> tuple[str, ...]:
        return (*super().processes(), *self.worker_names())

    def running(self) -> dict[str, int]:
        """As :meth:`LocalAirflow.running`; a worker renames itself (``[celeryd: worker-1@...]``), found by that."""
        if not self.pids_file.exists():
            return {}
        pids: dict[str, int] = json.loads(self.pids_file.read_text())
        return {name: pid for name, pid in pids.items()
                if process_runs_as(pid, b"celery" if name.startswith("worker-") else b"airflow")}  # fmt: skip

    def _prepare_broker(self) -> None:
        """Create the broker's tables and queues and the result backend's tables once, before any process races to.

        kombu and Celery create them on first use. Two workers starting together both try,
        and one fails on PostgreSQL's unique names (seen here: ``queue_id_sequence``,
        ``kombu_queue``); kombu catches no such error when two declare one queue.
        """
        # Heavy, and needed only when starting the Celery shape.
        from celery.backends.database.session import SessionManager
        from kombu.connection import Connection

        env = self.env()
        default = env.get("AIRFLOW__OPERATORS__DEFAULT_QUEUE", "default")
        queues = {q for spec in [default, *self.queues.values()] for q in spec.split(",") if q}
        with Connection(env["AIRFLOW__CELERY__BROKER_URL"]) as conn:  # type: ignore[no-untyped-call]
            channel = conn.default_channel
            for queue in sorted(queues):
                channel.queue_declare(queue=queue)  # the first one creates the tables
        SessionManager().session_factory(dburi=env["AIRFLOW__CELERY__RESULT_BACKEND"].removeprefix("db+")).close()

    def _start(self) -> None:
        self._prepare_broker()
        super()._start()
        pids = json.loads(self.pids_file.read_text())
        for name in self.worker_names():
            pids[name] = self._start_worker(name)
        self.pids_file.write_text(json.dumps(pids))

    def _start_worker(self, name: str) -> int:
        unshare = shutil.which("unshare")
        if unshare is None or os.geteuid() != 0:
            raise AirflowStartError("a Celery worker in namespaces of its own needs util-linux 'unshare' and root")
        env = self.env()
        keep = under_tmp([Path(sys.prefix), Path(sys.base_prefix), project_root(),
                          Path(env["AIRFLOW__CORE__DAGS_FOLDER"]), Path(env["AIRFLOW__CORE__PLUGINS_FOLDER"]),
                          *[Path(env[k]) for k in ("TIDEMARK_FEEDS_DIR",) if env.get(k)]])  # fmt: skip
        home = WORKER_ROOT / "home"
        env.update({"AIRFLOW_HOME": str(home), "HOME": str(home), "TMPDIR": "/tmp"})
        number = int(name.removeprefix("worker-"))
        queues = self.queues.get(number, env.get("AIRFLOW__OPERATORS__DEFAULT_QUEUE", "default"))
        exe = str(Path(sys.executable).with_name("airflow"))
        args = [unshare, "-m", "-u", "--propagation", "private", "sh", "-c",
                namespace_script(self.hostname(name), keep), exe, "celery", "worker",
                "--queues", queues, "--concurrency", str(self.concurrency), "--skip-serve-logs",
                "--without-mingle", "--without-gossip", "--celery-hostname", f"{name}@%h"]  # fmt: skip
        # The log file is opened here, before the namespace: readable from this machine.
        with (self.home / "logs" / f"{name}.log").open("w") as log:
            proc = subprocess.Popen(
                args, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd="/tmp",
            )  # fmt: skip
        return proc.pid

    def start_worker(self, name: str) -> None:
        """Start ``name`` again (after :meth:`kill_worker`): a fresh machine, an empty ``/tmp``."""
        pids = json.loads(self.pids_file.read_text())
        pids[name] = self._start_worker(name)
        self.pids_file.write_text(json.dumps(pids))

    def namespace_pids(self, worker: str) -> list[int]:
        """Every process in ``worker``'s mount namespace: the worker, its task processes, their spark-submit."""
        pid = self.running().get(worker)
        if pid is None:
            return []
        try:
            mnt = os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "ns" / "mnt") == mnt:
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def kill_worker(self, worker: str) -> list[int]:
        """The machine dies: SIGKILL to every process of ``worker``'s namespace at once, nothing told first."""
        pids = self.namespace_pids(worker)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        return pids

    def worker_file(self, worker: str, relative: str) -> Path:
        """A path inside ``worker``'s own ``/tmp`` as this machine reaches it (through ``/proc``)."""
        return Path(f"/proc/{self.running()[worker]}/root") / WORKER_ROOT.relative_to("/") / relative


def main(argv: list[str] | None = None) -> int:
    """``up`` starts (or reuses) the local Kafka cluster unless ``TIDEMARK_BOOTSTRAP_SERVERS`` names one, then
    the Celery shape, and returns with it running; ``down`` stops it."""
    parser = argparse.ArgumentParser(prog="python -m tidemark.devtools.celery", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.action == "down":
        stopped = CeleryAirflow().down()
        print("stopped: " + (", ".join(stopped) or "nothing was running"))
        return 0
    bootstrap = os.environ.get("TIDEMARK_BOOTSTRAP_SERVERS", "")
    if not bootstrap:
        from tidemark.devtools.kafka.cluster import LocalCluster

        bootstrap = LocalCluster().up().bootstrap_servers
    airflow = CeleryAirflow(port=args.port, workers=args.workers, bootstrap_servers=bootstrap)
    # A try-out on one machine: unless told otherwise, state in a folder outside every worker's private /tmp
    # and checkpoints in the same PostgreSQL database. A deployment sets an s3:// state dir (docs/deploy.md).
    extra = {"TIDEMARK_STATE_DIR": str(airflow.home / "state"), "TIDEMARK_CHECKPOINT_URL": airflow.database_url}
    airflow.extra_env = {k: os.environ.get(k) or v for k, v in extra.items()}
    airflow.up()
    print(f"Airflow (CeleryExecutor, {args.workers} workers) at {airflow.url}; home {airflow.home}")
    print(f"state: {airflow.extra_env['TIDEMARK_STATE_DIR']}; worker logs: {airflow.home / 'logs'}")
    for user, password in airflow.passwords().items():
        # Shown to the person who started Airflow (as `make airflow` does); never logged elsewhere.
        print(f"login: {user} / {password}")
    print("stop it with: make airflow-celery-down")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AirflowStartError as exc:  # a message naming the remedy, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
