"""A real S3 endpoint on this machine: s3proxy on its filesystem backend, for tests and try-outs.

The s3proxy jar comes from Maven Central through the ``pom.xml`` beside this module and
is cached outside the clone (``~/.cache/tidemark/s3proxy-<version>/``), like the Kafka
jars. :func:`start` runs it on a free 127.0.0.1 port with AWS signature checking on
(``s3proxy.authorization=aws-v2-or-v4``, one identity with a random secret) and the
``filesystem-nio2`` backend under a fresh folder (the older ``filesystem`` backend lists
multipart-upload leftovers and folders as objects). :meth:`LocalS3.env` gives the
variables a client needs: the standard ``AWS_*`` ones plus ``TIDEMARK_S3_ENDPOINT``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from tidemark.devtools.kafka.cluster import free_port, java, pom_property
from tidemark.devtools.maven import copy_dependencies, fetch_once
from tidemark.devtools.processes import stop_pid
from tidemark.errors import LocalServerError
from tidemark.settings import cache_root

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
S3A_POM = HERE / "s3a-pom.xml"
# s3proxy's backends: "filesystem-nio2" keeps objects as files; "transient" keeps them in memory
# as plain keys. Hadoop's s3a commits (rename) fail on the first with "destination parent is
# not a directory" (seen with hadoop-aws 3.5.0) and pass on the second.
BACKENDS = ("filesystem-nio2", "transient")
START_TIMEOUT_S = 90.0
REGION = "us-east-1"


def s3proxy_version() -> str:
    return pom_property(POM, "s3proxy.version")


def fetch_jar() -> Path:
    """The s3proxy jar, downloaded once with Maven (about 41 MB)."""
    target = cache_root() / f"s3proxy-{s3proxy_version()}"
    jar = target / f"s3proxy-{s3proxy_version()}-jar-with-dependencies.jar"
    what = f"s3proxy {s3proxy_version()}"
    fetch_once(target, lambda partial: copy_dependencies(POM, partial, what, LocalServerError),
               done=lambda found: jar.exists())  # fmt: skip
    return jar


def fetch_s3a_jars() -> Path:
    """The folder of Hadoop's s3a connector jars for pyspark's Hadoop (``s3a-pom.xml``), downloaded once with Maven."""
    target = cache_root() / f"s3a-{pom_property(S3A_POM, 'hadoop.version')}"
    return fetch_once(
        target, lambda partial: copy_dependencies(S3A_POM, partial, "the s3a connector", LocalServerError)
    )


@dataclass(frozen=True)
class LocalS3:
    """One running s3proxy: where it keeps its data, its port, its credentials and its pid."""

    home: Path
    port: int
    access_key: str
    secret_key: str
    pid: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    def env(self) -> dict[str, str]:
        """What a client needs, as environment variables (the secret included: keep it out of logs)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
            "TIDEMARK_S3_ENDPOINT": self.endpoint,
        }

    def create_bucket(self, name: str) -> None:
        """Create a bucket through the S3 API."""
        import pyarrow.fs as pafs

        pafs.S3FileSystem(
            access_key=self.access_key, secret_key=self.secret_key, endpoint_override=self.endpoint,
            region=REGION, allow_bucket_creation=True,
        ).create_dir(name)  # fmt: skip

    def stop(self, purge: bool = True) -> None:
        stop_pid(self.pid)
        if purge:
            shutil.rmtree(self.home, ignore_errors=True)


def start(base: Path | None = None, backend: str = "filesystem-nio2") -> LocalS3:
    """Start s3proxy on a free port with a fresh, empty data dir; returns once it answers.

    ``backend`` is one of :data:`BACKENDS` (``transient``: where Spark writes through s3a).
    """
    if backend not in BACKENDS:
        raise LocalServerError(f"unknown s3proxy backend {backend!r}: one of {', '.join(BACKENDS)}")
    jar = fetch_jar()
    home = Path(tempfile.mkdtemp(prefix="tidemark-s3-", dir=base))
    (home / "data").mkdir()
    port = free_port()
    access_key, secret_key = "tidemark", secrets.token_hex(16)
    config = home / "s3proxy.conf"
    config.write_text(
        "\n".join([
            f"s3proxy.endpoint=http://127.0.0.1:{port}",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={access_key}",
            f"s3proxy.credential={secret_key}",
            f"jclouds.provider={backend}",
            f"jclouds.filesystem.basedir={home / 'data'}",
            f"jclouds.identity={access_key}",
            f"jclouds.credential={secret_key}",
        ]) + "\n"
    )  # fmt: skip
    os.chmod(config, 0o600)
    log = home / "s3proxy.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [java(), "-Xmx256m", "-XX:+UseSerialGC", "-jar", str(jar), "--properties", str(config)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=home,
        )  # fmt: skip
    server = LocalS3(home=home, port=port, access_key=access_key, secret_key=secret_key, pid=proc.pid)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text()[-3000:]
            server.stop(purge=False)
            raise LocalServerError(f"s3proxy did not start on 127.0.0.1:{port} (log {log}):\n{tail}")
        time.sleep(0.2)
    return server


def _answers(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        if sock.connect_ex(("127.0.0.1", port)) != 0:
            return False
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)  # our own local server
    except urllib.error.HTTPError:
        return True  # 403 to an anonymous request: it is up and checking signatures
    except OSError:
        return False
    return True
