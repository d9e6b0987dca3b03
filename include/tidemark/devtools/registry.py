"""A local Confluent-compatible schema registry: Apicurio Registry on its in-memory storage.

Confluent's own registry is not on Maven Central; Apicurio Registry is, as one
``tar.gz`` (about 104 MB) that :func:`fetch` downloads once with Maven and unpacks into
the cache (``~/.cache/tidemark/apicurio-registry-<version>/``), like the Kafka jars.
:func:`start` runs it on a free 127.0.0.1 port and returns once its Confluent API
(``/apis/ccompat/v7``) answers. It needs no Kafka (H2 in memory), so a stopped registry
forgets its schemas; one started ``durable`` keeps them in an H2 file in its folder, so
:func:`restart` brings it back on the same port with the same ids (what a registry outage
looks like to a feed). It differs from Confluent's in two ways that matter to callers:
schema ids are content ids (not consecutive), and the default compatibility is ``NONE``.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tidemark.devtools.kafka.cluster import free_port, java
from tidemark.devtools.maven import fetch_once, run_maven
from tidemark.devtools.processes import stop_pid
from tidemark.errors import LocalServerError
from tidemark.settings import cache_root

APICURIO_VERSION = "3.0.9"  # 3.1+ needs Java 21
START_TIMEOUT_S = 120.0
CCOMPAT_PATH = "/apis/ccompat/v7"


def home() -> Path:
    return cache_root() / f"apicurio-registry-{APICURIO_VERSION}"


def runner_jar() -> Path:
    return home() / f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"


def fetch() -> Path:
    """The registry's runner jar, downloaded and unpacked once; later calls return it at once."""
    jar = runner_jar()

    def fill(partial: Path) -> None:
        # dependency:copy by coordinates: as a <dependency> it fails (its parent POM is not on Central).
        artifact = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
        what = f"Apicurio Registry {APICURIO_VERSION}"
        run_maven(["dependency:copy", f"-Dartifact={artifact}", f"-DoutputDirectory={partial}"], what,
                  LocalServerError, cwd=partial)  # fmt: skip
        archives = list(partial.glob("*.tar.gz"))
        if not archives:
            raise LocalServerError(f"Maven fetched no archive of {what} into {partial}")
        with tarfile.open(archives[0]) as tar:
            tar.extractall(partial, filter="data")
        archives[0].unlink()
        found = list(partial.rglob(jar.name))
        if not found:
            raise LocalServerError(f"the Apicurio Registry archive has no {jar.name} (unpacked in {partial})")
        # The runner jar finds its lib/ folder beside itself: the folder it sits in becomes the target.
        if found[0].parent != partial:
            for item in found[0].parent.iterdir():
                item.rename(partial / item.name)

    fetch_once(home(), fill, done=lambda target: (target / jar.name).exists())
    return jar


@dataclass(frozen=True)
class LocalRegistry:
    """One running registry: its folder (log), port and pid."""

    home: Path
    port: int
    pid: int
    durable: bool = False

    @property
    def url(self) -> str:
        """The Confluent-compatible API, what schema registry clients take as their URL."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    @property
    def log_file(self) -> Path:
        return self.home / "registry.log"

    def stop(self, purge: bool = True) -> None:
        stop_pid(self.pid)
        if purge:
            shutil.rmtree(self.home, ignore_errors=True)


def start(base: Path | None = None, port: int | None = None, *, durable: bool = False) -> LocalRegistry:
    """Start a registry (empty) on ``port`` or a free one; returns once its Confluent API answers.

    ``durable``: its schemas live in an H2 file in its folder, so that :func:`restart` keeps them.
    """
    folder = Path(tempfile.mkdtemp(prefix="tidemark-registry-", dir=base))
    return _launch(folder, port or free_port(), durable)


def restart(server: LocalRegistry) -> LocalRegistry:
    """Start a stopped ``server`` again in its folder and on its port (a durable one with its schemas and ids)."""
    return _launch(server.home, server.port, server.durable)


def _launch(folder: Path, port: int, durable: bool) -> LocalRegistry:
    jar = fetch()
    log = folder / "registry.log"
    storage = [f"-Dapicurio.datasource.url=jdbc:h2:file:{folder / 'schemas'}"] if durable else []
    cmd = [
        java(), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
        f"-Dquarkus.http.port={port}", "-Dquarkus.http.host=127.0.0.1", *storage,
        "-jar", str(jar),
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=folder)
    server = LocalRegistry(home=folder, port=port, pid=proc.pid, durable=durable)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not answers(server.url):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:]
            server.stop(purge=False)
            raise LocalServerError(f"Apicurio Registry did not start on 127.0.0.1:{port} (log {log}):\n{tail}")
        time.sleep(0.3)
    return server


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=5):  # our own local server
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
