"""A throwaway PostgreSQL server for the tests and local try-outs of the shared checkpoint store.

It uses the PostgreSQL binaries Debian's ``postgresql`` package installs
(``/usr/lib/postgresql/<version>/bin``, or ``initdb`` on ``PATH``): ``initdb`` into a
fresh folder, ``pg_ctl start`` on a free 127.0.0.1 port, password authentication
(SCRAM) for one database user with a random password, and ``pg_ctl stop`` at the end.
PostgreSQL refuses to run as root, so when started by root the server runs as a
dedicated system user (``tidemark-pg``, created on first use) that owns the folder.
:func:`ensure_installed` installs the Debian package when the binaries are missing and
the caller is root with ``apt-get`` (as ``.ci/run`` does), and otherwise says what to
install. Nothing here is used by a production deployment: there the store's URL points
at a real server.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tidemark.devtools.kafka.cluster import free_port
from tidemark.errors import LocalServerError

SYSTEM_USER = "tidemark-pg"
DB_USER = "tidemark"
DB_NAME = "tidemark"
START_TIMEOUT_S = 60
# What Debezium's PostgreSQL connector needs of a server: logical decoding, a slot and a sender for it.
LOGICAL_REPLICATION = {"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4"}


def bin_dir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: the newest Debian version, else ``PATH``."""
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if versions:
        return Path(versions[-1]).parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def ensure_installed() -> Path:
    """The PostgreSQL binaries' folder, installing Debian's ``postgresql`` package if root can."""
    found = bin_dir()
    if found is not None:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "postgresql"]):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if proc.returncode != 0:
                raise LocalServerError(f"'{' '.join(cmd)}' failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        found = bin_dir()
    if found is None:
        raise LocalServerError(
            "PostgreSQL's initdb and pg_ctl were not found: install the 'postgresql' package "
            "(apt-get install postgresql) to run the tests of the shared checkpoint store"
        )
    return found


def _service_user() -> str | None:
    """The user the server runs as: ``None`` (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    if not _user_exists(SYSTEM_USER):
        proc = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode not in (0, 9):  # 9: created meanwhile by a concurrent session
            raise LocalServerError(f"could not create system user {SYSTEM_USER}: {proc.stderr.strip()}")
    return SYSTEM_USER


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@dataclass(frozen=True)
class LocalPostgres:
    """One running throwaway server: its folder, port and the URL of its database."""

    home: Path
    port: int
    password: str
    user: str | None  # the system user the server runs as (None: the caller)

    @property
    def url(self) -> str:
        """``postgresql://tidemark:<password>@127.0.0.1:<port>/tidemark`` (holds the password: never log it)."""
        return f"postgresql://{DB_USER}:{self.password}@127.0.0.1:{self.port}/{DB_NAME}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    def _run(self, args: list[str], what: str) -> None:
        cmd = ["runuser", "-u", self.user, "--", *args] if self.user else args
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=self.home)
        if proc.returncode != 0:
            log = self.home / "server.log"
            tail = log.read_text()[-3000:] if log.exists() else ""
            raise LocalServerError(f"PostgreSQL {what} failed (exit {proc.returncode}): {proc.stderr[-2000:]}\n{tail}")

    def stop(self, purge: bool = True) -> None:
        """Stop the server (fast shutdown) and, with ``purge``, remove its folder."""
        binaries = bin_dir()
        if binaries is not None and (self.data_dir / "postmaster.pid").exists():
            self._run([str(binaries / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"], "stop")
        if purge:
            shutil.rmtree(self.home, ignore_errors=True)


def start(base: Path | None = None, settings: Mapping[str, str] | None = None) -> LocalPostgres:
    """Create a fresh cluster in a new folder under ``base`` (default: the temp dir) and start it.

    ``settings``: server settings beyond the defaults (``-c name=value``), e.g. ``wal_level=logical`` for a
    change stream (:data:`LOGICAL_REPLICATION`).
    """
    binaries = ensure_installed()
    user = _service_user()
    # Not under pytest's tmp dirs: those are private to root, and the server's user must reach it.
    home = Path(tempfile.mkdtemp(prefix="tidemark-pg-", dir=base))
    password = secrets.token_hex(16)
    server = LocalPostgres(home=home, port=free_port(), password=password, user=user)
    pwfile = home / "pwfile"
    pwfile.write_text(password + "\n")
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        os.chown(pwfile, entry.pw_uid, entry.pw_gid)
    os.chmod(home, 0o700)
    os.chmod(pwfile, 0o600)
    try:
        server._run(
            [str(binaries / "initdb"), "-D", str(server.data_dir), "-U", DB_USER, f"--pwfile={pwfile}",
             "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync"],
            "initdb",
        )  # fmt: skip
        pwfile.unlink()
        options = f"-c listen_addresses=127.0.0.1 -p {server.port} -k {home} -c fsync=off -c max_connections=50"
        options += "".join(f" -c {name}={value}" for name, value in (settings or {}).items())
        server._run(
            [str(binaries / "pg_ctl"), "-D", str(server.data_dir), "-l", str(home / "server.log"), "-o", options,
             "-w", "-t", str(START_TIMEOUT_S), "start"],
            "start",
        )  # fmt: skip
        _createdb(server)
    except BaseException:
        server.stop(purge=True)
        raise
    return server


def _createdb(server: LocalPostgres) -> None:
    """Create the ``tidemark`` database through the driver (no password on a command line)."""
    import psycopg

    with psycopg.connect(
        host="127.0.0.1", port=server.port, user=DB_USER, password=server.password, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f"CREATE DATABASE {DB_NAME}")
