"""A local Kafka Connect worker with Debezium's PostgreSQL connector, for a real change stream.

Kafka Connect's runtime (``org.apache.kafka:connect-runtime``, the version of the embedded
cluster's brokers) and Debezium's PostgreSQL connector come from Maven Central: :func:`fetch`
copies them, with a log4j2 binding, into the cache once
(``~/.cache/tidemark/connect-<kafka>-debezium-<version>/lib``), like the Kafka jars.
:func:`start` runs one worker in standalone mode against a Kafka cluster: its source offsets
in a file of its folder, so that :func:`restart` resumes where the last offset flush left
off (what a crashed worker re-delivers), its REST API on a free 127.0.0.1 port.
:func:`debezium_postgres` is a connector's config for a PostgreSQL database with
``wal_level=logical`` (the ``pgoutput`` plugin, a publication of the named tables), with
JSON keys and values without schemas: the envelope a feed's ``change_format: debezium``
reads. Nothing here is used by a production deployment.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemark.devtools.kafka.cluster import free_port, java, kafka_version
from tidemark.devtools.maven import copy_dependencies, fetch_once
from tidemark.devtools.processes import stop_pid
from tidemark.errors import LocalServerError
from tidemark.settings import cache_root

DEBEZIUM_VERSION = "3.6.1.Final"  # the newest whose every module Maven Central serves here
LOG4J_VERSION = "2.24.3"
START_TIMEOUT_S = 120.0
MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"

POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.tidemark</groupId>
  <artifactId>tidemark-local-connect</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>io.debezium</groupId><artifactId>debezium-connector-postgres</artifactId>
      <version>{debezium}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId>
      <version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

LOG4J_CONFIG = """status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = ${sys:connect.log.file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
"""


def home() -> Path:
    return cache_root() / f"connect-{kafka_version()}-debezium-{DEBEZIUM_VERSION}"


def fetch() -> Path:
    """The folder of the worker's and the connector's jars, fetched by Maven once; later calls return it at once."""

    def fill(partial: Path) -> None:
        pom = partial / "pom.xml"
        pom.write_text(POM.format(kafka=kafka_version(), debezium=DEBEZIUM_VERSION, log4j=LOG4J_VERSION))
        what = f"Kafka Connect {kafka_version()} with Debezium {DEBEZIUM_VERSION}"
        copy_dependencies(pom, partial / "lib", what, LocalServerError)
        (partial / ".complete").touch()

    return fetch_once(home(), fill) / "lib"


@dataclass(frozen=True)
class LocalConnect:
    """One running standalone worker: its folder (config, offsets, log), REST port, pid and cluster."""

    home: Path
    port: int
    pid: int
    bootstrap_servers: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.home / "connect.log"

    def stop(self, purge: bool = True) -> None:
        """SIGTERM (offsets flushed on the way out), SIGKILL after the grace period."""
        stop_pid(self.pid)
        if purge:
            shutil.rmtree(self.home, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL, no offset flush: a crashed worker (on restart it sends again what it sent since the last flush)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        stop_pid(self.pid)  # waits for it to be gone

    @property
    def offsets_file(self) -> Path:
        return self.home / "offsets.dat"

    def restart_tasks(self, name: str) -> None:
        """Restart connector ``name`` and its tasks: a task flushes its source offsets when it stops, and the
        next periodic flush comes ``offset.flush.interval.ms`` after it starts again."""
        _request("POST", f"{self.url}/connectors/{name}/restart?includeTasks=true")
        self.wait_running(name)

    def put_connector(self, name: str, config: Mapping[str, str]) -> None:
        """Create (or reconfigure) connector ``name`` and wait until it and its task run."""
        _request("PUT", f"{self.url}/connectors/{name}/config", dict(config))
        self.wait_running(name)

    def wait_running(self, name: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        status: Any = None
        while time.monotonic() < deadline:
            try:
                status = _request("GET", f"{self.url}/connectors/{name}/status")
            except LocalServerError:
                status = None
            tasks = (status or {}).get("tasks", [])
            states = [status["connector"]["state"], *(t["state"] for t in tasks)] if status else []
            if "FAILED" in states:
                raise LocalServerError(f"connector {name} failed: {json.dumps(status)[-3000:]}")
            if tasks and set(states) == {"RUNNING"}:
                return
            time.sleep(0.3)
        raise LocalServerError(f"connector {name} not running after {timeout_s:.0f} s: {status} (log {self.log_file})")


def start(bootstrap_servers: str, base: Path | None = None, *, offset_flush_ms: int = 1000) -> LocalConnect:
    """A standalone worker against ``bootstrap_servers``; returns once its REST API answers.

    ``offset_flush_ms``: how often source offsets are written to its offsets file (what a
    restart after :meth:`LocalConnect.kill` resumes from).
    """
    folder = Path(tempfile.mkdtemp(prefix="tidemark-connect-", dir=base))
    settings = {
        "bootstrap.servers": bootstrap_servers,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "offset.storage.file.filename": str(folder / "offsets.dat"),
        "offset.flush.interval.ms": str(offset_flush_ms),
        "listeners": f"http://127.0.0.1:{free_port()}",
        "plugin.discovery": "only_scan",
    }
    (folder / "worker.properties").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    (folder / "log4j2.properties").write_text(LOG4J_CONFIG)
    return _launch(folder)


def restart(worker: LocalConnect) -> LocalConnect:
    """Start a stopped ``worker`` again in its folder: its connectors are created again by the caller
    (standalone keeps no configs), and resume from its offsets file."""
    return _launch(worker.home)


def _launch(folder: Path) -> LocalConnect:
    lib = fetch()
    settings = dict(
        line.split("=", 1) for line in (folder / "worker.properties").read_text().splitlines() if "=" in line
    )
    port = int(settings["listeners"].rsplit(":", 1)[1])
    log = folder / "connect.log"
    cmd = [
        java(), "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
        f"-Dlog4j2.configurationFile={folder / 'log4j2.properties'}", f"-Dconnect.log.file={log}",
        "-cp", f"{lib}/*", MAIN_CLASS, str(folder / "worker.properties"),
    ]  # fmt: skip
    with (folder / "stdout.log").open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=folder)
    worker = LocalConnect(home=folder, port=port, pid=proc.pid, bootstrap_servers=settings["bootstrap.servers"])
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(worker.url):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (log.read_text(errors="replace") if log.exists() else "")[-3000:]
            worker.stop(purge=False)
            raise LocalServerError(f"Kafka Connect did not start on 127.0.0.1:{port} (log {log}):\n{tail}")
        time.sleep(0.3)
    return worker


def debezium_postgres(
    *,
    host: str,
    port: int,
    user: str,
    password: str,
    database: str,
    topic_prefix: str,
    tables: Sequence[str],
    slot: str = "tidemark",
    **extra: str,
) -> dict[str, str]:
    """Debezium's PostgreSQL connector for ``tables`` (``schema.table``): topics ``<topic_prefix>.<schema>.<table>``,
    the ``pgoutput`` plugin and a publication of those tables alone, deletes followed by tombstones."""
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": host,
        "database.port": str(port),
        "database.user": user,
        "database.password": password,
        "database.dbname": database,
        "topic.prefix": topic_prefix,
        "table.include.list": ",".join(tables),
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": f"{slot}_publication",
        "publication.autocreate.mode": "filtered",
        **extra,
    }


def _request(method: str, url: str, body: Mapping[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # our own local worker
            text = resp.read()
    except urllib.error.HTTPError as exc:
        raise LocalServerError(f"Kafka Connect answered {exc.code} to {method} {url}: {exc.read()[:2000]!r}") from exc
    except OSError as exc:
        raise LocalServerError(f"Kafka Connect did not answer {method} {url}: {exc}") from exc
    return json.loads(text) if text else None


def _answers(url: str) -> bool:
    """Whether the worker is ready: its REST server answers before its resources are there (404 until then)."""
    try:
        with urllib.request.urlopen(f"{url}/connectors", timeout=5):  # our own local worker
            return True
    except OSError:  # HTTPError (404 while starting) included
        return False
