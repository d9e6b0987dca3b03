"""An embedded Apache Kafka cluster (KRaft) for the demo and the integration tests.

The broker jars come from Maven Central through the ``pom.xml`` beside this module and
are cached outside the clone. Each node is a combined broker+controller JVM on
127.0.0.1 with its own ports, data dir and log, started detached so that it outlives
the command that started it. Everything about a running cluster (ports, pids, dirs)
lives in one ``state.json`` under the cluster's home, which the CLI, the demo and the
test fixtures read; ``down`` signals only the processes recorded there, after checking
that each pid still runs this cluster's config (pids get reused).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import closing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from tidemark.devtools.maven import copy_dependencies, fetch_once
from tidemark.errors import ConfigError, LocalKafkaError, TidemarkError
from tidemark.kafka.connection import ENV_BOOTSTRAP, KafkaConnection, from_env
from tidemark.settings import cache_root

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
LOG4J_CONFIG = HERE / "log4j2.properties"

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def pom_property(pom: Path, name: str) -> str:
    """A ``<name>`` property of a pom shipped with the package (a pinned Maven version)."""
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom.read_text())
    if match is None:  # pragma: no cover - the pom is part of the package
        raise TidemarkError(f"{pom} has no <{name}> property")
    return match.group(1)


def kafka_version() -> str:
    """The Kafka version pinned in the pom."""
    return pom_property(POM, "kafka.version")


def default_home() -> Path:
    """Where the default cluster keeps its state, data and logs."""
    return Path(os.environ.get("TIDEMARK_KAFKA_HOME", cache_root() / "cluster"))


def jars_dir() -> Path:
    return cache_root() / f"kafka-{kafka_version()}" / "lib"


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise LocalKafkaError(f"'{tool}' was not found on PATH. {hint}")
    return path


def java() -> str:
    return _require(
        "java", "The local Kafka cluster needs Java 17 or newer (e.g. apt-get install openjdk-17-jre-headless)."
    )


def fetch_jars(quiet: bool = True) -> Path:
    """Download the broker jars once with Maven; later calls return the cached folder."""

    def fill(partial: Path) -> None:
        copy_dependencies(POM, partial, f"Kafka {kafka_version()}", LocalKafkaError, quiet=quiet)

    return fetch_once(jars_dir(), fill)


# free_port's ports lie below the kernel's ephemeral range (ip_local_port_range), from here up.
LOWEST_PORT = 10_000
_PORT_CHOICE = random.SystemRandom()  # not the seeded `random`: pytest-randomly seeds it alike in every worker


def free_port() -> int:
    """A port on 127.0.0.1 that nothing uses now, for a server started next.

    Chosen at random below the kernel's ephemeral range: the kernel gives ports from that
    range to every outgoing connection, and one of them once took a port chosen there
    (by binding port 0) before the server meant for it had bound it (the api-server of an
    Airflow started beside Kafka and Spark clients in the test suite).
    """
    low = _ephemeral_low()
    if low - LOWEST_PORT >= 1_000:
        for _ in range(100):
            port = _PORT_CHOICE.randrange(LOWEST_PORT, low)
            with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def port_in_use(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


# Broker settings sized for a 2-core machine; callers may override any of them.
BASE_SETTINGS: dict[str, str] = {
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.replica.fetchers": "1",
    "background.threads": "4",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": "16777216",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
    "transaction.state.log.min.isr": "1",
    "min.insync.replicas": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    # Fast retention so tests can watch data and offsets expire.
    "log.retention.check.interval.ms": "1000",
    "log.initial.task.delay.ms": "0",
    "offsets.retention.check.interval.ms": "5000",
    # The log cleaner looks for compactable logs every second, not every 15 s (its default idle backoff).
    "log.cleaner.backoff.ms": "1000",
    "num.partitions": "1",
}


@dataclass(frozen=True)
class Node:
    node_id: int
    broker_port: int
    controller_port: int
    directory: str
    pid: int | None = None

    @property
    def path(self) -> Path:
        return Path(self.directory)

    @property
    def config_file(self) -> Path:
        return self.path / "server.properties"

    @property
    def log_file(self) -> Path:
        return self.path / "logs" / "server.log"

    @property
    def stdout_file(self) -> Path:
        return self.path / "logs" / "stdout.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.broker_port}"


@dataclass(frozen=True)
class ClusterState:
    home: str
    cluster_id: str
    kafka_version: str
    nodes: tuple[Node, ...]
    settings: Mapping[str, str] = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def node(self, node_id: int) -> Node:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise LocalKafkaError(f"node {node_id} is not part of the cluster at {self.home}")

    def with_node(self, updated: Node) -> ClusterState:
        return replace(self, nodes=tuple(updated if n.node_id == updated.node_id else n for n in self.nodes))

    def to_json(self) -> str:
        doc = asdict(self)
        doc["settings"] = dict(self.settings)
        doc["bootstrap_servers"] = self.bootstrap_servers
        return json.dumps(doc, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        doc = json.loads(text)
        return cls(
            home=doc["home"],
            cluster_id=doc["cluster_id"],
            kafka_version=doc["kafka_version"],
            nodes=tuple(Node(**n) for n in doc["nodes"]),
            settings=doc.get("settings", {}),
        )


def process_runs_as(pid: int | None, marker: bytes) -> bool:
    """Whether ``pid`` is alive and is the process whose command line holds ``marker``.

    Pids wrap quickly (pid_max may be 32768), so a recorded pid is checked before it is
    signalled or waited on. For a moment after ``Popen`` returns, a child's
    ``/proc/<pid>/cmdline`` reads empty while it runs (measured here: a few ms, far longer
    on a loaded machine); an empty command line counts as "ours, starting" unless the
    process is a zombie. A plain "is the marker there" check once failed clusters and
    services that went on to start fine.
    """
    if pid is None:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if cmdline:
        return marker in cmdline
    return state not in ("Z", "X")


def _pid_runs(pid: int | None, config_file: Path) -> bool:
    """True if ``pid`` is alive and is the JVM started with ``config_file`` (or starting as it)."""
    return process_runs_as(pid, str(config_file).encode())


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


class LocalCluster:
    """A KRaft cluster of combined broker+controller nodes living under ``home``."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = (home or default_home()).resolve()
        self.state_file = self.home / "state.json"

    # -- state -----------------------------------------------------------------------

    def state(self) -> ClusterState | None:
        if not self.state_file.exists():
            return None
        return ClusterState.from_json(self.state_file.read_text())

    def _save(self, state: ClusterState) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(state.to_json())
        tmp.replace(self.state_file)

    def running_nodes(self) -> list[Node]:
        state = self.state()
        if state is None:
            return []
        return [n for n in state.nodes if _pid_runs(n.pid, n.config_file)]

    # -- lifecycle -------------------------------------------------------------------

    def up(self, brokers: int = 3, settings: Mapping[str, str] | None = None) -> ClusterState:
        """Start the cluster (creating it on first use); idempotent when it already runs."""
        if brokers < 1:
            raise LocalKafkaError(f"--brokers must be at least 1, got {brokers}")
        state = self.state()
        if state is not None and len(state.nodes) != brokers:
            if self.running_nodes():
                raise LocalKafkaError(
                    f"a {len(state.nodes)}-broker cluster already runs at {self.home}; "
                    f"run 'tidemark kafka down --purge' before asking for {brokers} brokers"
                )
            state = None
        if state is None or not all(n.config_file.exists() for n in state.nodes):
            shutil.rmtree(self.home / "nodes", ignore_errors=True)
            state = self._create(brokers, dict(settings or {}))
        for node in state.nodes:
            if not _pid_runs(node.pid, node.config_file):
                state = self._launch(state, node)
        self.wait_ready(state)
        return state

    def _create(self, brokers: int, settings: dict[str, str]) -> ClusterState:
        lib = fetch_jars()
        self.home.mkdir(parents=True, exist_ok=True)
        nodes = []
        taken: set[int] = set()
        for node_id in range(1, brokers + 1):
            ports: list[int] = []
            while len(ports) < 2:
                port = free_port()
                if port not in taken:
                    taken.add(port)
                    ports.append(port)
            directory = self.home / "nodes" / f"node-{node_id}"
            nodes.append(Node(node_id, ports[0], ports[1], str(directory)))
        state = ClusterState(
            home=str(self.home),
            cluster_id=_cluster_id(),
            kafka_version=kafka_version(),
            nodes=tuple(nodes),
            settings=settings,
        )
        for node in state.nodes:
            (node.path / "data").mkdir(parents=True, exist_ok=True)
            (node.path / "logs").mkdir(parents=True, exist_ok=True)
            node.config_file.write_text(self._server_properties(state, node))
        # Formatting is one short JVM per node; run them side by side.
        procs = [
            (
                node,
                subprocess.Popen(
                    self._format_command(lib, state, node),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    cwd=node.path,
                ),
            )
            for node in state.nodes
        ]
        for node, proc in procs:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise LocalKafkaError(f"formatting node {node.node_id} failed (exit {proc.returncode}):\n{out}")
        self._save(state)
        return state

    def _format_extra(self) -> list[str]:
        """More ``StorageTool format`` arguments (a secured cluster's SCRAM users)."""
        return []

    def _format_command(self, lib: Path, state: ClusterState, node: Node) -> list[str]:
        return [
            *self._java_cmd(lib, heap="128m"),
            f"-Dkafka.logs.dir={node.log_file.parent}",
            "kafka.tools.StorageTool",
            "format",
            # "=" form: a base64url cluster id may start with "-", which a separate
            # argument would make look like an option.
            f"--cluster-id={state.cluster_id}",
            f"--config={node.config_file}",
            "--ignore-formatted",
            *self._format_extra(),
        ]

    def _server_properties(self, state: ClusterState, node: Node) -> str:
        return "".join(f"{k}={v}\n" for k, v in self._properties(state, node).items())

    def _properties(self, state: ClusterState, node: Node) -> dict[str, str]:
        replicas = str(min(3, len(state.nodes)))
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in state.nodes)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{node.broker_port},CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.broker_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.path / "data"),
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "default.replication.factor": "1",
            **BASE_SETTINGS,
            **state.settings,
        }
        return props

    def _java_cmd(self, lib: Path, heap: str) -> list[str]:
        return [
            java(),
            f"-Xms{heap}",
            f"-Xmx{heap}",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp",
            f"{lib}/*",
        ]

    def _launch(self, state: ClusterState, node: Node) -> ClusterState:
        for port in (node.broker_port, node.controller_port):
            if port_in_use(port):
                raise LocalKafkaError(
                    f"port {port} of Kafka node {node.node_id} is taken by another process; free it, or run "
                    f"'tidemark kafka down --purge' and 'tidemark kafka up' to pick new ports"
                )
        lib = fetch_jars()
        node.log_file.parent.mkdir(parents=True, exist_ok=True)
        with node.stdout_file.open("ab") as out:
            proc = subprocess.Popen(
                [
                    *self._java_cmd(lib, heap="384m"),
                    f"-Dkafka.logs.dir={node.log_file.parent}",
                    "kafka.Kafka",
                    str(node.config_file),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=node.path,
                start_new_session=True,  # outlive the CLI that started it
            )
        state = state.with_node(replace(node, pid=proc.pid))
        self._save(state)
        return state

    def wait_ready(self, state: ClusterState, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until every running node answers a metadata request listing all brokers."""
        deadline = time.monotonic() + timeout
        pending = {n.node_id for n in state.nodes}
        while pending:
            for node in state.nodes:
                if node.node_id not in pending:
                    continue
                if not _pid_runs(node.pid, node.config_file):
                    raise LocalKafkaError(
                        f"Kafka node {node.node_id} exited while starting. Last lines of {node.log_file}:\n"
                        f"{_tail(node.log_file)}\n--- {node.stdout_file}:\n{_tail(node.stdout_file, 15)}"
                    )
                admin = AdminClient({**self._admin_config(node), "logger": _QUIET})
                try:
                    meta = admin.list_topics(timeout=2)
                except Exception:  # noqa: BLE001 - not up yet; retried until the deadline
                    continue
                if len(meta.brokers) == len(state.nodes):
                    pending.discard(node.node_id)
            if pending and time.monotonic() > deadline:
                raise LocalKafkaError(
                    f"Kafka nodes {sorted(pending)} did not answer within {timeout:.0f}s; see "
                    + ", ".join(str(state.node(i).log_file) for i in sorted(pending))
                )
            if pending:
                time.sleep(0.5)

    def _admin_config(self, node: Node) -> dict[str, Any]:
        """librdkafka settings of a client that may ask ``node`` for the whole cluster's metadata."""
        return {"bootstrap.servers": node.address}

    def down(self, purge: bool = False) -> list[int]:
        """Stop the nodes this cluster started; with ``purge`` also delete its data.

        All nodes are signalled at once: stopped one by one, the last controller waits
        for a quorum that is already gone. A purge kills outright, its data being moot.
        """
        state = self.state()
        stopped = []
        if state is not None:
            live = [n for n in state.nodes if _pid_runs(n.pid, n.config_file)]
            for node in live:
                os.kill(node.pid or 0, signal.SIGKILL if purge else signal.SIGTERM)
            for node in live:
                self._stop(node, kill=purge)
                stopped.append(node.node_id)
            for node in state.nodes:
                state = state.with_node(replace(node, pid=None))
            self._save(state)
        if purge:
            shutil.rmtree(self.home, ignore_errors=True)
        return stopped

    def _stop(self, node: Node, kill: bool = False) -> bool:
        """Signal ``node`` (if still running) and wait until it has exited."""
        if node.pid is None or not _pid_runs(node.pid, node.config_file):
            return False
        os.kill(node.pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _pid_runs(node.pid, node.config_file):
            try:  # reap it when we are its parent (fixtures, restarts), or it lingers as a zombie
                os.waitpid(node.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if time.monotonic() > deadline:
                os.kill(node.pid, signal.SIGKILL)
                deadline = time.monotonic() + STOP_TIMEOUT_S
            time.sleep(0.1)
        return True

    # -- single nodes (fault tests) --------------------------------------------------

    def stop_node(self, node_id: int, kill: bool = False) -> None:
        state = self._require_state()
        node = state.node(node_id)
        self._stop(node, kill=kill)
        self._save(state.with_node(replace(node, pid=None)))

    def start_node(self, node_id: int) -> None:
        state = self._require_state()
        state = self._launch(state, state.node(node_id))
        self.wait_ready(state)

    def _require_state(self) -> ClusterState:
        state = self.state()
        if state is None:
            raise LocalKafkaError(f"no local cluster at {self.home}; run 'tidemark kafka up' first")
        return state

    def status(self) -> Iterator[tuple[Node, bool]]:
        state = self.state()
        for node in state.nodes if state else ():
            yield node, _pid_runs(node.pid, node.config_file)


def _cluster_id() -> str:
    # Kafka's cluster ids are base64url-encoded UUIDs without padding; making one here
    # spares a JVM start of `StorageTool random-uuid`.
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


# librdkafka logs every refused connection of a starting cluster; those are expected.
_QUIET = logging.getLogger("tidemark.devtools.kafka.startup")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def connection_from_env(environ: Mapping[str, str] | None = None) -> KafkaConnection:
    """``TIDEMARK_*`` variables, else the embedded cluster that ``tidemark kafka up`` started.

    The fallback of the CLI, the demo and the benchmarks, which pass it explicitly; the
    runtime's :func:`~tidemark.kafka.connection.from_env` never reaches for a local cluster.
    """
    env = os.environ if environ is None else environ
    if env.get(ENV_BOOTSTRAP, "").strip():
        return from_env(env)
    cluster = LocalCluster()
    state = cluster.state()
    if state is None or not cluster.running_nodes():
        raise ConfigError(
            f"no Kafka brokers configured: set {ENV_BOOTSTRAP} (and TIDEMARK_KAFKA_* security "
            "settings), or start the embedded cluster with 'tidemark kafka up'"
        )
    return from_env({**env, ENV_BOOTSTRAP: state.bootstrap_servers})
