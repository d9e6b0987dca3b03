"""A throwaway Spark standalone cluster on this machine: one master and one worker, for tests.

Both run from pyspark's own pip distribution (``pyspark/bin/spark-class`` with
``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), each in its own JVM
process, on free 127.0.0.1 ports, with their logs, work folder and an empty Spark conf
folder under a fresh temporary folder. :func:`start` returns once the master's JSON page
lists the worker as ALIVE; :meth:`LocalSpark.stop` stops the worker, then the master,
checking each pid's ``/proc/<pid>/cmdline`` before signalling it (pids wrap quickly).

The worker's environment has no ``PYTHONPATH`` and its executors' Python is the
interpreter running this module; whatever a job needs beyond pyspark and the installed
dependencies must be shipped with it (``tidemark`` is, see :func:`tidemark.job.entry.ship_package`).

``start(private_tmp=True)`` starts the worker in a mount namespace of its own
(``unshare -m``, root only) with a fresh tmpfs on ``/tmp`` that holds its work and scratch
folders: the worker, its executors and their Python workers then cannot see any file the
driver writes under ``/tmp`` (the test folders, the default staging folder), as on a
cluster whose machines share no disk. Only the installation (the virtualenv and pyspark,
when the checkout itself is under ``/tmp``) is bound back in, as every machine of a cluster
has its own. The worker's work folder is then not readable from
outside; its log still is (the log file is opened here, before the namespace).
Nothing here is used by a production deployment: there ``tidemark_spark`` points at a
real master.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemark.devtools.kafka.cluster import free_port
from tidemark.errors import LocalServerError

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
# Inside the worker's own /tmp (a tmpfs of its mount namespace) with ``private_tmp``.
PRIVATE_WORK = Path("/tmp/tidemark-spark-worker/work")
PRIVATE_SCRATCH = Path("/tmp/tidemark-spark-worker/scratch")


def private_tmp_script(keep: list[str]) -> str:
    """``sh -c`` text run under ``unshare -m`` (mounts private by default) before ``exec spark-class ARGS...``.

    A fresh tmpfs on ``/tmp``, then the folders in ``keep`` (relative to ``/tmp``: the
    installation, when a checkout lives there) bound back from the covered ``/tmp``, which
    the shell still reaches through its working folder (hence no canonicalizing: that would
    turn ``./x`` into ``/tmp/x``, on the new tmpfs). The worker starts in ``/``, so no
    relative path leads it back to the driver's files.
    """
    binds = ""
    for k in map(shlex.quote, keep):
        binds += f" && mkdir -p /tmp/{k} && mount --no-canonicalize --bind ./{k} /tmp/{k}"
    return (
        f"cd /tmp && mount -t tmpfs -o size=2g,mode=1777 tidemark-worker-tmp /tmp{binds} && cd / "
        f'&& mkdir -p {PRIVATE_WORK} {PRIVATE_SCRATCH} && exec "$0" "$@"'
    )


def _installation_under_tmp() -> list[str]:
    """The Python installation and pyspark folders that lie under ``/tmp`` (a checkout there), relative to it."""
    found: list[Path] = []
    for folder in (Path(sys.prefix), Path(sys.base_prefix), spark_home()):
        resolved = folder.resolve()
        if resolved.is_relative_to("/tmp") and resolved != Path("/tmp"):
            found.append(resolved.relative_to("/tmp"))
    outermost = [f for f in found if not any(f != o and f.is_relative_to(o) for o in found)]
    return sorted({str(f) for f in outermost})


def spark_home() -> Path:
    """pyspark's installed folder: it carries ``bin/spark-class`` and ``jars/``."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise LocalServerError(f"{home} has no bin/spark-class: is the full pyspark distribution installed?")
    return home


@dataclass(frozen=True)
class LocalSpark:
    """A running master and worker: ports, pids and the folder holding their files."""

    home: Path
    master_port: int
    master_ui_port: int
    worker_ui_port: int
    master_pid: int
    worker_pid: int
    private_tmp: bool = False  # the worker runs in its own mount namespace with a private /tmp

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def work_dir(self) -> Path:
        """The worker's work folder: one ``app-*/<executor id>/`` folder per executor.

        With ``private_tmp`` it is inside the worker's own ``/tmp``: not visible from here.
        """
        return PRIVATE_WORK if self.private_tmp else self.home / "work"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    def state(self) -> dict[str, Any]:
        """The master's JSON status page (workers, applications)."""
        return _master_state(self.master_ui_port)

    def stop(self, purge: bool = True) -> None:
        """Stop the worker (its executors with it), then the master; remove the folder if ``purge``."""
        for pid, main_class in ((self.worker_pid, WORKER_CLASS), (self.master_pid, MASTER_CLASS)):
            _terminate(pid, main_class, self.home)
        if purge:
            shutil.rmtree(self.home, ignore_errors=True)


def _runs(pid: int, main_class: str, home: Path) -> bool:
    """Whether ``pid`` is still the JVM we started (its class and our folder on its command line)."""
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False  # our child, reaped now
    except ChildProcessError:
        pass
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return main_class.encode() in cmdline and str(home).encode() in cmdline


def _terminate(pid: int, main_class: str, home: Path) -> None:
    if not _runs(pid, main_class, home):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _runs(pid, main_class, home):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + STOP_TIMEOUT_S
        time.sleep(0.1)


def _master_state(ui_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as resp:  # our own local master
        doc: dict[str, Any] = json.loads(resp.read().decode())
    return doc


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.pop("PYTHONPATH", None)  # executors must not find tidemark on an inherited path
    conf_dir = home / "conf"
    conf_dir.mkdir(exist_ok=True)
    env.update({
        "SPARK_HOME": str(spark_home()),
        "SPARK_CONF_DIR": str(conf_dir),  # empty: no spark-defaults.conf or spark-env.sh from elsewhere
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(home / "logs"),
        "SPARK_DAEMON_MEMORY": "256m",
        "PYSPARK_PYTHON": sys.executable,
    })  # fmt: skip
    return env


def _spawn(args: list[str], env: dict[str, str], log: Path, private_tmp: bool = False) -> subprocess.Popen[bytes]:
    command = [str(spark_home() / "bin" / "spark-class"), *args]
    if private_tmp:
        unshare = shutil.which("unshare")
        if unshare is None or os.geteuid() != 0:
            raise LocalServerError("a worker with a private /tmp needs util-linux 'unshare' and root (unshare -m)")
        # unshare, sh and spark-class each exec the next: the pid stays the worker JVM's.
        script = private_tmp_script(_installation_under_tmp())
        command = [unshare, "-m", "--propagation", "private", "sh", "-c", script, *command]
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=log.parent,
        )  # fmt: skip


def start(base: Path | None = None, *, cores: int = 2, memory: str = "1g", private_tmp: bool = False) -> LocalSpark:
    """Start a master and one worker (``cores``, ``memory``); returns once the worker is ALIVE.

    ``private_tmp``: the worker in a mount namespace of its own (see the module docstring).
    """
    home = Path(tempfile.mkdtemp(prefix="tidemark-spark-", dir=base))
    for sub in ("logs", "work"):
        (home / sub).mkdir()
    env = _environment(home)
    master_port, master_ui, worker_port, worker_ui = (free_port() for _ in range(4))
    # The home folder is on each command line (-D... below) so that stop() can recognise its JVMs.
    env["SPARK_DAEMON_JAVA_OPTS"] = f"-Dtidemark.spark.home={home} -XX:+UseSerialGC"
    master = _spawn(
        [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(master_port), "--webui-port", str(master_ui)],
        env, home / "logs" / "master.log",
    )  # fmt: skip
    worker: subprocess.Popen[bytes] | None = None
    cluster = LocalSpark(home, master_port, master_ui, worker_ui, master.pid, -1, private_tmp)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        # The master first (the worker gives up after a few failed registrations), at the ports
        # it really bound: a port taken between free_port() and the bind makes Spark move to
        # the next one, where another process may answer.
        master_port, master_ui = _bound_ports(master, "master", home, deadline, ("sparkMaster", "MasterUI"))
        worker_env = {**env, "SPARK_LOCAL_DIRS": str(PRIVATE_SCRATCH)} if private_tmp else env
        worker = _spawn(
            [WORKER_CLASS, f"spark://127.0.0.1:{master_port}", "--host", "127.0.0.1", "--port", str(worker_port),
             "--webui-port", str(worker_ui), "--cores", str(cores), "--memory", memory,
             "--work-dir", str(PRIVATE_WORK if private_tmp else home / "work")],
            worker_env, home / "logs" / "worker.log", private_tmp,
        )  # fmt: skip
        # stop() goes by pid
        cluster = LocalSpark(home, master_port, master_ui, worker_ui, master.pid, worker.pid, private_tmp)
        (worker_ui,) = _bound_ports(worker, "worker", home, deadline, ("WorkerUI",))
        cluster = LocalSpark(home, master_port, master_ui, worker_ui, master.pid, worker.pid, private_tmp)
        while not any(w.get("state") == "ALIVE" for w in _master_state(master_ui).get("workers", [])):
            _check_alive(master, "master", home, deadline)
            _check_alive(worker, "worker", home, deadline)
            time.sleep(0.3)
    except BaseException:
        cluster.stop(purge=False)
        raise
    return cluster


def _bound_ports(
    proc: subprocess.Popen[bytes], name: str, home: Path, deadline: float, services: tuple[str, ...]
) -> tuple[int, ...]:
    """The ports the daemon's log says its ``services`` bound, once it has said so for all of them."""
    log = home / "logs" / f"{name}.log"
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        found = [re.search(rf"Successfully started service '{s}' on port (\d+)", text) for s in services]
        if all(found):
            return tuple(int(m.group(1)) for m in found if m)
        _check_alive(proc, name, home, deadline)
        time.sleep(0.3)


def _check_alive(proc: subprocess.Popen[bytes], name: str, home: Path, deadline: float) -> None:
    if proc.poll() is None and time.monotonic() < deadline:
        return
    log = home / "logs" / f"{name}.log"
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    what = f"exited with {proc.returncode}" if proc.returncode is not None else f"not ready in {START_TIMEOUT_S:.0f}s"
    raise LocalServerError(f"the Spark standalone {name} {what} (log {log}):\n{tail}")


def fetch_avro_jar() -> Path:
    """The spark-avro jar (``from_avro``), downloaded once with Maven into the cache.

    Tests point ``TIDEMARK_SPARK_AVRO_JAR`` at it, so no Spark application of the suite
    resolves :data:`tidemark.spark.session.AVRO_PACKAGE` through Ivy at its start (seconds
    each time); its only dependencies (Avro, xz, Scala's parallel collections) ship with pyspark.
    """
    from tidemark.spark.session import AVRO_PACKAGE

    return fetch_jar(AVRO_PACKAGE)


def fetch_openlineage_jar() -> Path:
    """OpenLineage's Spark listener (one shaded jar, no dependencies), for ``TIDEMARK_SPARK_OPENLINEAGE_JAR``."""
    from tidemark.spark.session import OPENLINEAGE_PACKAGE

    return fetch_jar(OPENLINEAGE_PACKAGE)


def fetch_jar(package: str) -> Path:
    """The jar of ``package`` (``group:artifact:version``) from Maven Central, downloaded once into the cache."""
    from tidemark.devtools.maven import fetch_once, run_maven
    from tidemark.settings import cache_root

    _, artifact, version = package.split(":")
    target = cache_root() / f"{re.sub(r'_2[.]1[0-9]$', '', artifact)}-{version}"
    jar = target / f"{artifact}-{version}.jar"

    def fill(partial: Path) -> None:
        run_maven(["dependency:copy", f"-Dartifact={package}", f"-DoutputDirectory={partial}"], package,
                  LocalServerError, cwd=partial)  # fmt: skip
        if not (partial / jar.name).exists():
            raise LocalServerError(f"Maven fetched no {jar.name} for {package} into {partial}")

    fetch_once(target, fill, done=lambda found: jar.exists())
    return jar
