"""The staging folder both publishers fill, and how Spark writes into it and reads it back.

The job writes a plan's records once into a fresh :class:`Staging` folder (partitioned as
:data:`tidemark.staged.STAGED_PARTITION_COLUMNS` says, under :data:`tidemark.staged.PASS_DIR`);
validation reads them there and a publisher (:mod:`tidemark.output.parquet` or
:mod:`tidemark.output.iceberg`) turns them into its publication. Both backends import what
they share from here and from :mod:`tidemark.output.base`, never from each other: where
staging folders live (a local folder, or the object store when the executors share no disk
with the driver, :func:`stages_on_store`), how leftovers of crashed attempts are cleared,
Spark's path to a folder and its Parquet options, the ``date`` partition, and the files'
names by place.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tidemark.errors import StateStoreError
from tidemark.staged import PASS_DIR, RAW_VALUE_COLUMN, ROW_HASH_COLUMN
from tidemark.storage import Location, Where

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, DataFrameWriter

# A Kafka payload is opaque, mostly unique bytes per record: min/max statistics on it prune
# nothing, and a dictionary of it is built only to be thrown away once it overflows. Both
# cost CPU on every row (measured: the 5M-record job 5-13% faster without them). The same
# holds for the staged hash of each record (ROW_HASH_COLUMN).
PAYLOAD_COLUMNS = ("value", RAW_VALUE_COLUMN, ROW_HASH_COLUMN)


def parquet_writer(df: DataFrame, mode: str) -> DataFrameWriter:
    """``df.write`` in ``mode`` with Tidemark's Parquet options: no dictionary or statistics on payload columns."""
    options: dict[str, str] = {}
    for column in df.columns:
        if column in PAYLOAD_COLUMNS:
            options[f"parquet.enable.dictionary#{column}"] = "false"
            options[f"parquet.column.statistics.enabled#{column}"] = "false"
    return df.write.mode(mode).options(**options)


def utc_date() -> Column:
    """The ``date`` partition: the record timestamp's UTC date, whatever the session time zone."""
    from pyspark.sql import functions as F

    return F.date_from_unix_date(F.floor(F.unix_micros("timestamp") / 86_400_000_000).cast("int"))


def spark_path(where: Where) -> str:
    """The path Spark opens for a folder: local as is, ``s3://`` through Hadoop's s3a connector."""
    text = str(where)
    return "s3a://" + text[len("s3://") :] if text.startswith("s3://") else text


STAGE_ON_STORE_ENV = "TIDEMARK_STAGE_ON_STORE"  # "1": stage on the object store, "0": never; unset: by master


def stages_on_store(output: Location, master: str) -> bool:
    """Whether the executors stage ``output``'s plan on the object store rather than in a local folder.

    Only an object-store output can. ``TIDEMARK_STAGE_ON_STORE`` (``1``/``0``) decides;
    unset, a ``TIDEMARK_STAGING_DIR`` set by the deployment (a mount the driver and the
    executors share) keeps staging there, and otherwise the store is used whenever the
    master is not ``local[...]`` (a cluster's executors need not share a disk with the driver).
    """
    if output.is_local:
        return False
    setting = os.environ.get(STAGE_ON_STORE_ENV, "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    return not os.environ.get("TIDEMARK_STAGING_DIR") and not master.startswith("local")


@dataclass(frozen=True)
class Staging:
    """A fresh staging folder for one plan, and where the job's single write goes.

    The job writes every record once, to :attr:`written_url`, partitioned by
    ``(outcome, topic, date)``: ``outcome=ok`` for records to publish, else why the
    record is bad. Validation reads it back (columnar, so a check costs only the columns
    it needs) and :func:`tidemark.output.parquet.publish_staged` turns it into the publication by renames.

    With ``remote`` (an object-store folder) Spark writes and reads there instead of under
    ``root``, so nothing assumes that the driver sees the executors' disks: the driver
    pulls what it publishes into ``root`` (:meth:`pull`) once Spark has written it.
    """

    output: Location
    plan_id: str
    root: Path  # the driver's local folder, where the publication is assembled
    remote: Location | None = None  # where Spark writes and reads the staged files, when not ``root``

    @property
    def written(self) -> Path:
        return self.root / PASS_DIR

    @property
    def written_url(self) -> str:
        return self.url(PASS_DIR)

    def url(self, *parts: str) -> str:
        """A folder of the staging as Spark's side sees it: a local path, or an object-store URL."""
        if self.remote is None:
            return str(self.root.joinpath(*parts))
        where = self.remote
        for part in parts:
            where = where / part
        return str(where)

    def outcomes(self, outcome_column: str) -> list[str]:
        """The outcome folders (``<outcome_column>=<code>``) Spark wrote, sorted."""
        if self.remote is None:
            found = [d.name for d in self.written.iterdir() if d.is_dir()] if self.written.exists() else []
        else:
            found = [c.name for c in (self.remote / PASS_DIR).children(folders_only=True)]
        return sorted(name for name in found if name.startswith(f"{outcome_column}="))

    def remove(self, *parts: str) -> None:
        """Delete a staged folder (an outcome that is neither published nor quarantined)."""
        Location.of(self.url(*parts)).remove_tree()

    def pull(self, source: str, target: Path) -> None:
        """Copy the Parquet files of the remote staged folder ``source`` (relative) into the local ``target``."""
        if self.remote is None:
            return
        folder = self.remote / source
        for name, _ in folder.files():
            if name.endswith(".parquet"):
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                (target / name).write_bytes((folder / name).read_bytes())

    def parquet_rows(self, folders: Sequence[str]) -> int:
        """The records in the Parquet files under ``folders`` (from :meth:`url`), from their footers."""
        import pyarrow.parquet as pq

        rows = 0
        for folder in map(Location.of, folders):
            for name, _ in folder.files():
                if name.endswith(".parquet"):
                    with folder.fs.open_input_file((folder / name).fs_path) as fh:
                        rows += pq.read_metadata(fh).num_rows
        return rows

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        release(self.root)
        if self.remote is not None:
            try:
                self.remote.remove_tree()
            except (StateStoreError, FileNotFoundError):  # left over: the plan's next attempt removes it
                pass


def local_staging_base(output: Location) -> Path:
    """``TIDEMARK_STAGING_DIR/tidemark-staging/<hash of output's URL>``; without that setting,
    ``<temp dir>/tidemark-staging-<uid>/<hash>``, the user's own folder (:func:`private_dir`)."""
    chosen = os.environ.get("TIDEMARK_STAGING_DIR")
    if chosen:  # the deployment's folder (a mount the driver and the executors share, maybe as other users)
        base = Path(chosen) / "tidemark-staging"
    else:
        base = private_dir(Path(tempfile.gettempdir()) / f"tidemark-staging-{os.getuid()}")
    return base / hashlib.sha256(output.url.encode()).hexdigest()[:16]


def private_dir(path: Path) -> Path:
    """``path``, a folder only this user may enter (mode 0700), created so; one that is a symbolic link, another
    user's, or open to others is refused: in a shared temp dir anyone may have made it first, to read what is
    staged there (a masked feed's raw bytes) or to point it elsewhere."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    found = path.lstat()
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise StateStoreError(
            f"the local staging folder {path} is not a folder of this user ({os.getuid()}): someone else made it; "
            "remove it, or set TIDEMARK_STAGING_DIR to a folder only the Airflow user can read"
        )
    if found.st_mode & 0o077:
        raise StateStoreError(
            f"the local staging folder {path} is open to other users (mode {stat.S_IMODE(found.st_mode):o}); "
            f"chmod 700 {path}, or set TIDEMARK_STAGING_DIR to a folder only the Airflow user can read"
        )
    return path


def staging_name(plan_id: str, run_id: str | None, nonce: str) -> str:
    """A staging folder's name: ``<run id>.<nonce>`` for a run's job (its own, whatever other run shares the plan
    id), ``<plan id>.<nonce>`` for a job outside any run."""
    return f"{run_id or plan_id}.{nonce}"


LOCK_SUFFIX = ".lock"  # beside a staging folder: held by the process staging there, for as long as it does
_HELD: dict[str, int] = {}  # this process's locks, by folder


def make_root(base: Path, name: str) -> Path:
    """Create the staging folder ``base/name`` with its lock ``base/name.lock`` held by this process.

    The lock (``flock``) proves the folder live: the kernel releases it when the process ends, however it ends
    (SIGKILL included), so a later settle can tell a dead job's leftovers (:func:`remove_run_staging`) from the
    folder of a job still running.
    """
    root = base / name
    fd = os.open(f"{root}{LOCK_SUFFIX}", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a fresh name: nobody else holds it
    _HELD[str(root)] = fd
    root.mkdir()
    return root


def release(root: Path) -> None:
    """Drop this process's lock of staging folder ``root`` (it is gone, or no longer staged in)."""
    Path(f"{root}{LOCK_SUFFIX}").unlink(missing_ok=True)
    fd = _HELD.pop(str(root), None)
    if fd is not None:
        os.close(fd)


def _dead(root: Path) -> bool:
    """Whether no process stages in ``root``: its lock is free (or it has none: a folder of an older Tidemark)."""
    try:
        fd = os.open(f"{root}{LOCK_SUFFIX}", os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # and with it the probe's lock
    return True


def _remove_local(base: Path, prefix: str, *, dead_only: bool) -> set[str]:
    """Delete the staging folders under ``base`` named ``<prefix>.*`` (with ``dead_only``, those no live process
    holds) and their locks; the names removed."""
    removed = set()
    for leftover in sorted(base.glob(f"{prefix}.*")) if base.exists() else []:
        if leftover.name.endswith(LOCK_SUFFIX):
            continue
        if dead_only and not _dead(leftover):
            continue
        shutil.rmtree(leftover, ignore_errors=True)
        release(leftover)
        removed.add(leftover.name)
    for lock in sorted(base.glob(f"{prefix}.*{LOCK_SUFFIX}")) if base.exists() else []:
        folder = lock.with_name(lock.name[: -len(LOCK_SUFFIX)])
        if not folder.exists() and (not dead_only or _dead(folder)):
            release(folder)
    return removed


def prepare_staging_base(base: Path, plan_id: str, run_id: str | None = None) -> Path:
    """``base``, created, without what crashed attempts of run ``run_id`` (else of a job of ``plan_id`` outside any
    run) left there; never another run's folder, nor one a live process stages in."""
    _remove_local(base, run_id or plan_id, dead_only=True)
    base.mkdir(parents=True, exist_ok=True)
    return base


def prepare_remote_staging(base: Location, plan_id: str, run_id: str | None = None) -> Location:
    """``base`` without what crashed attempts of run ``run_id`` (else of ``plan_id`` outside any run) left there on
    the object store."""
    for leftover in base.children(folders_only=True):
        if leftover.name.startswith(f"{run_id or plan_id}."):
            leftover.remove_tree()
    return base


def remove_run_staging(local: Path, remote: Location | None, run_id: str, *, dead_only: bool = False) -> None:
    """Delete the staging folders of run ``run_id`` under ``local`` (the driver's base) and ``remote`` (the object
    store's ``<output>/_staging/``): named by the run (:func:`staging_name`), so only its own.

    ``dead_only`` (the run is still open, its job may be running): only folders whose lock no live process holds,
    and a folder on the store only when its local twin (same name) was one of them. Else (the run is promoted or
    given up) every one. Best effort: what an unreachable store keeps, the next promotion or discard removes.
    """
    removed = _remove_local(local, run_id, dead_only=dead_only)
    if remote is None:
        return
    try:
        for leftover in remote.children(folders_only=True):
            if leftover.name.startswith(f"{run_id}.") and (not dead_only or leftover.name in removed):
                leftover.remove_tree()
    except (StateStoreError, FileNotFoundError):
        pass


def name_by_place(staging: Path, attempt: str | None = None) -> None:
    """Rename each folder's Parquet files ``part-00000.parquet``, ... (sorted by Spark's name).

    With ``attempt``: ``part-00000.<attempt>.parquet``, so that no two publishers of the
    same plan ever write (or delete) the same object.
    """
    suffix = f".{attempt}" if attempt else ""
    for folder in sorted({p.parent for p in staging.rglob("*.parquet")}):
        temps = []
        for index, path in enumerate(sorted(folder.glob("*.parquet"))):
            temps.append(path.rename(folder / f".{index:05d}.renaming"))
        for index, temp in enumerate(temps):
            temp.rename(folder / f"part-{index:05d}{suffix}.parquet")
