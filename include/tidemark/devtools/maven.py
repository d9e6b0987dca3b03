"""Artefacts from Maven Central, fetched once per machine into the cache, whoever asks first.

Every local stand-in (the Kafka jars, the schema registry, and the test suite's s3proxy,
s3a and Spark packages) downloads with ``mvn`` into a folder of the cache. Several
processes ask at once (the test workers start their servers side by side on a fresh
machine), so :func:`fetch_once` lets one of them fetch under a file lock beside the target
while the others wait, into a partial folder that it empties first (what a killed fetch left
there goes), and renames it into place whole: a reader sees the complete folder or none. :func:`run_maven` runs one
Maven at a time, since Maven's local repository (``~/.m2``) has no lock of its own.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tidemark.errors import TidemarkError
from tidemark.settings import cache_root


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if missing) for the block's length."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch_once(target: Path, fill: Callable[[Path], None], *, done: Callable[[Path], bool] | None = None) -> Path:
    """``target``, filled by ``fill(partial)`` and renamed into place unless ``done(target)`` already holds
    (by default: it has the ``.complete`` marker that :func:`copy_dependencies` leaves).

    ``fill`` writes into an empty partial folder beside ``target``; it raises when the fetch failed,
    and the partial folder is then removed. One process fills at a time (the lock), and a
    process that waited finds ``done`` true and returns at once.
    """
    done = done or _complete
    if done(target):
        return target
    with file_lock(target.with_name(target.name + ".lock")):
        if done(target):
            return target
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            fill(partial)
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return target


def run_maven(
    args: Sequence[str], what: str, error: type[TidemarkError], *, cwd: Path | None = None, quiet: bool = True
) -> None:
    """``mvn -B [-q] ARGS``; raises ``error`` naming ``what`` with Maven's last lines when it fails."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(f"'mvn' was not found on PATH: Maven fetches {what} from Maven Central (apt-get install maven)")
    cmd = [mvn, "-B", *(["-q"] if quiet else []), *args]
    # One Maven at a time on this machine: Maven does not lock its local repository, and two fetches
    # that share an artefact (Kafka's tools and s3proxy share Jetty) corrupt each other's copy of it.
    with file_lock(cache_root() / "maven.lock"):
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise error(f"Maven could not fetch {what} (exit {proc.returncode}):\n{tail}")


def copy_dependencies(
    pom: Path, into: Path, what: str, error: type[TidemarkError], *, settings: Path | None = None, quiet: bool = True
) -> None:
    """The runtime dependencies of ``pom`` copied into ``into``, then marked complete (``into/.complete``)."""
    args = [*(["-s", str(settings)] if settings else []), "-f", str(pom), "dependency:copy-dependencies",
            f"-DoutputDirectory={into}", "-DincludeScope=runtime"]  # fmt: skip
    run_maven(args, what, error, quiet=quiet)
    (into / ".complete").touch()


def _complete(target: Path) -> bool:
    return (target / ".complete").exists()
