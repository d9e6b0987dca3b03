"""A local Airflow running Tidemark: ``make airflow`` / ``tidemark airflow up|down``, and the e2e tests.

:class:`LocalAirflow` gives Airflow its own home (SQLite metadata database), points it at
the project's ``dags/`` and ``plugins/`` folders, sets the ``tidemark_kafka`` and
``tidemark_spark`` connections as environment variables (the Kafka one at the given
bootstrap servers), and runs the four processes of Airflow 3's shape: ``api-server`` (UI,
REST API, Tidemark's view, and the execution API the tasks talk to), ``scheduler``
(LocalExecutor), ``dag-processor`` and ``triggerer`` (where lag-triggered feeds' triggers
run: :mod:`tidemark.orchestration.lag_trigger`). Each process gets its own
process group and log file under the home; their pids are kept in ``pids.json`` so that
``down`` (another shell, or the tests' teardown) stops exactly them.

Users come from SimpleAuthManager: ``admin`` (Admin) and ``viewer`` (Viewer); Airflow
generates their passwords into ``simple_auth_manager_passwords.json.generated``. The JWT
signing secret is generated per home and never printed.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tidemark.config.models import package_root
from tidemark.devtools.kafka.cluster import free_port, port_in_use, process_runs_as
from tidemark.errors import TidemarkError

PROCESSES = ("api-server", "scheduler", "dag-processor", "triggerer")
USERS = "admin:admin,viewer:viewer"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
# With port 0: how many free ports the api-server is started on when another process takes each first.
PORT_ATTEMPTS = 3


class AirflowStartError(TidemarkError):
    """Airflow did not come up; the message names the log to read."""


def project_root() -> Path:
    """The folder holding ``dags/``, ``plugins/`` and ``include/``."""
    return package_root().parent


def default_home() -> Path:
    return Path(os.environ.get("TIDEMARK_AIRFLOW_HOME", Path.home() / ".cache" / "tidemark" / "airflow"))


@dataclass
class LocalAirflow:
    """One local Airflow installation under ``home``."""

    home: Path = field(default_factory=default_home)
    # 0: a free port, chosen again should another process bind it before the api-server does.
    port: int = 8080
    bootstrap_servers: str = ""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    unpause: bool = True  # DAGs start unpaused, so a run triggered from the view is picked up

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pids_file(self) -> Path:
        return self.home / "pids.json"

    def _jwt_secret(self) -> str:
        path = self.home / "jwt_secret"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(32))
            path.chmod(0o600)
        return path.read_text().strip()

    def env(self) -> dict[str, str]:
        """The environment of every Airflow process (and of ``airflow`` CLI calls against this home)."""
        root = project_root()
        bin_dir = str(Path(sys.executable).parent)
        kafka = {"conn_type": "kafka", "extra": {"bootstrap.servers": self.bootstrap_servers}}
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "plugins"),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(not self.unpause),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": USERS,
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": self._jwt_secret(),
            "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR": "True",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            "AIRFLOW_CONN_TIDEMARK_KAFKA": json.dumps(kafka),
            "AIRFLOW_CONN_TIDEMARK_SPARK": json.dumps({"conn_type": "spark", "host": "local[*]"}),
            "GX_ANALYTICS_ENABLED": "False",
            "SPARK_LOCAL_IP": "127.0.0.1",
            # spark-submit, airflow and the task interpreters come from this virtualenv
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            **self.extra_env,
        }
        env.pop("TIDEMARK_BOOTSTRAP_SERVERS", None)  # Kafka settings come from the Airflow connection
        return env

    def airflow(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run one ``airflow`` CLI command against this home."""
        exe = str(Path(sys.executable).with_name("airflow"))
        proc = subprocess.run([exe, *args], env=self.env(), capture_output=True, text=True, check=False)
        if check and proc.returncode != 0:
            raise AirflowStartError(f"airflow {' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        return proc

    def running(self) -> dict[str, int]:
        """The processes of this home still alive, by name."""
        if not self.pids_file.exists():
            return {}
        pids: dict[str, int] = json.loads(self.pids_file.read_text())
        return {name: pid for name, pid in pids.items() if process_runs_as(pid, b"airflow")}

    def up(self, timeout_s: float = 240.0) -> None:
        """Migrate the database, start the processes and wait until the API answers."""
        if self.running():
            raise AirflowStartError(f"Airflow already runs from {self.home} (pids {self.running()}); stop it first")
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "logs").mkdir(exist_ok=True)
        any_port = self.port == 0
        if any_port:
            self.port = free_port()
        elif port_in_use(self.port):  # else the health check below could be answered by whatever listens there
            raise AirflowStartError(self._port_in_use())
        self.airflow("db", "migrate")
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self._start()
            try:
                self.wait_healthy(timeout_s)
                return
            except AirflowStartError as exc:
                if not self._port_was_taken():
                    raise
                if not any_port:
                    raise AirflowStartError(self._port_in_use()) from exc
                if attempt == PORT_ATTEMPTS:
                    raise
                # Free when chosen, taken before the api-server bound it (tests start servers side by side).
                self.port = free_port()

    def processes(self) -> tuple[str, ...]:
        """The names of the processes ``up`` starts (``pids.json``'s keys)."""
        return PROCESSES

    def _start(self) -> None:
        """Start the processes, each in a process group of its own, logging under ``logs/``."""
        env = self.env()  # names the api-server's port (AIRFLOW__API__BASE_URL): the same for all
        self.pids_file.write_text(json.dumps({name: self._spawn(name, env, "w") for name in PROCESSES}))

    def _spawn(self, name: str, env: Mapping[str, str], mode: str) -> int:
        exe = str(Path(sys.executable).with_name("airflow"))
        args = [exe, name] + (["--port", str(self.port), "--host", "127.0.0.1"] if name == "api-server" else [])
        with (self.home / "logs" / f"{name}.log").open(mode) as log:
            proc = subprocess.Popen(
                args, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: down() stops it and its children
            )  # fmt: skip
        return proc.pid

    def restart(self, name: str, *, kill: bool = False, timeout_s: float = 30.0) -> int:
        """Stop one process (SIGTERM, or SIGKILL with ``kill``: a crash) and start it again; its new pid.

        The e2e tests restart the triggerer this way: its triggers must come back from Airflow's
        database, with nothing lost and nothing fired twice.
        """
        pids: dict[str, int] = json.loads(self.pids_file.read_text())
        old = pids[name]
        try:
            os.killpg(old, signal.SIGKILL if kill else signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout_s
        while process_runs_as(old, b"airflow") and time.monotonic() < deadline:
            time.sleep(0.3)
        if process_runs_as(old, b"airflow"):
            os.killpg(old, signal.SIGKILL)
        pids[name] = self._spawn(name, self.env(), "a")
        self.pids_file.write_text(json.dumps(pids))
        return pids[name]

    def _port_in_use(self) -> str:
        return (
            f"Airflow's api-server could not listen on 127.0.0.1:{self.port}: another process uses that port; "
            "stop it or choose another port (tidemark airflow up --port N)"
        )

    def _port_was_taken(self) -> bool:
        """Whether the api-server's log says its port was in use (uvicorn's EADDRINUSE line)."""
        log = self.home / "logs" / "api-server.log"
        return log.exists() and "address already in use" in log.read_text(errors="replace")

    def wait_healthy(self, timeout_s: float) -> None:
        """Wait until the api-server answers and the scheduler and triggerer report healthy."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            alive = self.running()
            if dead := [n for n in self.processes() if n not in alive]:
                self.down(timeout_s=5)  # a start that failed: nothing to stop gracefully
                raise AirflowStartError(f"Airflow's {dead[0]} exited; see {self.home / 'logs' / (dead[0] + '.log')}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as resp:
                    doc = json.loads(resp.read())
                if all(doc.get(p, {}).get("status") == "healthy" for p in ("scheduler", "triggerer")):
                    return
                last = json.dumps(doc)
            except (OSError, ValueError) as exc:
                last = str(exc)
            time.sleep(1)
        self.down()
        raise AirflowStartError(f"Airflow at {self.url} not healthy after {timeout_s:.0f}s ({last}); logs: {self.home}")

    def down(self, timeout_s: float = 30.0) -> list[str]:
        """Stop this home's processes (their process groups), SIGTERM then SIGKILL."""
        alive = self.running()
        for pid in alive.values():
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.3)
        for pid in self.running().values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pids_file.unlink(missing_ok=True)
        return sorted(alive)

    def passwords(self) -> dict[str, str]:
        """The users' generated passwords (for the tests and for ``up``'s message to the person starting it)."""
        path = self.home / PASSWORDS_FILE
        return dict(json.loads(path.read_text())) if path.exists() else {}

    def token(self, user: str) -> str:
        """A REST API token for ``user`` (``POST /auth/token``)."""
        body = json.dumps({"username": user, "password": self.passwords()[user]}).encode()
        req = urllib.request.Request(
            f"{self.url}/auth/token", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return str(json.loads(resp.read())["access_token"])
        except urllib.error.HTTPError as err:
            raise AirflowStartError(f"no token for user '{user}': HTTP {err.code}") from err
