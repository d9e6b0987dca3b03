"""The one storage seam: a :class:`Location` is a local path or an object-store URL (``s3://bucket/prefix``).

The sink, the job and the pipeline reach published outputs (and the state they share)
through :class:`Location` only, never through ``open``/``os.rename`` on a string, so they
do not know which backend a location uses. The filesystem layer is ``pyarrow.fs``: it is
already a dependency (Parquet, Arrow batches), its ``S3FileSystem`` is the AWS SDK for
C++ shipped inside the pyarrow wheel (no extra download, no boto), and the same
:class:`pyarrow.fs.FileSystem` object reads Parquet directly. The local backend is
``pyarrow.fs.LocalFileSystem``, plus the two things object stores lack and Tidemark uses
on a local disk: an atomic ``rename(2)`` of a folder and ``fsync``.

S3 settings come from the environment only (never from feed files, plans or reports):
the standard ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` /
``AWS_REGION`` (or the SDK's other credential sources: profile, instance role, web
identity), and ``TIDEMARK_S3_ENDPOINT`` (or ``AWS_ENDPOINT_URL``) for S3-compatible
stores. In Airflow, :func:`tidemark.orchestration.dags.storage_env` turns an ``aws``
connection into those variables.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tidemark.errors import ConfigError, StateStoreError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

T = TypeVar("T")
ENDPOINT_ENV = "TIDEMARK_S3_ENDPOINT"
SCHEMES = ("s3",)


def is_url(text: str) -> bool:
    """Whether ``text`` names an object-store location (``scheme://...``) rather than a local path."""
    return "://" in text


@dataclass(frozen=True)
class Location:
    """A folder or file: a local absolute path or ``s3://bucket/key`` (no trailing slash)."""

    url: str

    @classmethod
    def of(cls, where: Where) -> Location:
        """Parse a path or URL; local paths become absolute, URLs are checked."""
        if isinstance(where, Location):
            return where
        text = str(where)
        if not is_url(text):
            return cls(str(Path(text).expanduser().resolve()))
        scheme, _, rest = text.partition("://")
        if scheme not in SCHEMES:
            raise ConfigError(f"location {text!r}: only local paths and s3://bucket/prefix are supported")
        rest = rest.strip("/")
        if not rest:
            raise ConfigError(f"location {text!r}: name a bucket, e.g. s3://bucket/prefix")
        return cls(f"{scheme}://{posixpath.normpath(rest)}")

    # -- names ---------------------------------------------------------------------------

    @property
    def is_local(self) -> bool:
        return not is_url(self.url)

    @property
    def name(self) -> str:
        return posixpath.basename(self._path)

    @property
    def parent(self) -> Location:
        if self.is_local:
            return Location(str(Path(self.url).parent))
        scheme = self.url.split("://", 1)[0]
        return Location(f"{scheme}://{posixpath.dirname(self._path)}")

    def __truediv__(self, part: str) -> Location:
        clean = part.strip("/")
        if not clean:
            return self
        if self.is_local:
            return Location(str(Path(self.url) / clean))
        return Location(f"{self.url}/{clean}")

    def with_name(self, name: str) -> Location:
        return self.parent / name

    def __str__(self) -> str:
        return self.url

    def local_path(self) -> Path:
        """This location as a local path; an object-store location is refused."""
        if not self.is_local:
            raise ConfigError(f"{self.url} is an object-store location; this step needs a local path")
        return Path(self.url)

    @property
    def _path(self) -> str:
        """The path inside the filesystem (``bucket/key`` for S3)."""
        return self.url if self.is_local else self.url.split("://", 1)[1]

    # -- the filesystem ------------------------------------------------------------------

    @property
    def fs(self) -> pafs.FileSystem:
        """The ``pyarrow.fs`` filesystem holding this location (pass it with :attr:`fs_path` to pyarrow)."""
        return _local_fs() if self.is_local else _s3_fs(*s3_settings())

    @property
    def fs_path(self) -> str:
        return self._path

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StateStoreError(f"could not {what} {self.url}: {exc}") from exc

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        info = self._call("look up", self.fs.get_file_info, self._path)
        return bool(info.type != pafs.FileType.NotFound)

    def is_file(self) -> bool:
        import pyarrow.fs as pafs

        info = self._call("look up", self.fs.get_file_info, self._path)
        return bool(info.type == pafs.FileType.File)

    def read_bytes(self) -> bytes:
        def read() -> bytes:
            with self.fs.open_input_stream(self._path) as stream:
                return bytes(stream.read())

        return self._call("read", read)

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        """Write a whole object at once: readers see the old content or the new, never a part.

        Local: a temporary file, ``fsync``, then ``rename(2)``. S3: one PUT (an object
        appears whole when the upload completes).
        """
        if self.is_local:
            write_durably(Path(self.url), data)
            return

        def put() -> None:
            with self.fs.open_output_stream(self._path) as stream:
                stream.write(data)

        self._call("write", put)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def mkdir(self) -> None:
        """Create this folder (local); object stores have no folders, so nothing to do there."""
        if self.is_local:
            Path(self.url).mkdir(parents=True, exist_ok=True)

    def children(self, folders_only: bool = False) -> list[Location]:
        """The immediate entries of this folder (files and sub-folders, or only folders), sorted by name."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self._path, allow_not_found=True, recursive=False)
        infos = self._call("list", self.fs.get_file_info, selector)
        if folders_only:
            infos = [i for i in infos if i.type == pafs.FileType.Directory]
        return sorted((self / posixpath.basename(i.path) for i in infos), key=lambda loc: loc.url)

    def files(self) -> Iterator[tuple[str, int]]:
        """Every file under this folder as ``(path relative to it, size)``, sorted."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self._path, allow_not_found=True, recursive=True)
        infos = self._call("list", self.fs.get_file_info, selector)
        prefix = self._path.rstrip("/") + "/"
        found = [
            (i.path[len(prefix) :], int(i.size))
            for i in infos
            if i.type == pafs.FileType.File and i.path.startswith(prefix)
        ]
        yield from sorted(found)

    def remove_tree(self) -> None:
        """Delete this folder and everything under it (missing: nothing to do)."""
        if self.is_local:
            shutil.rmtree(self.url, ignore_errors=True)
            return
        if self.exists():
            self._call("delete", self.fs.delete_dir, self._path)

    def remove_file(self) -> None:
        if self.is_local:
            Path(self.url).unlink(missing_ok=True)
        elif self.exists():
            self._call("delete", self.fs.delete_file, self._path)

    def upload_tree(self, source: Path, files: list[str] | None = None) -> None:
        """Copy the local folder ``source`` (or only ``files``, relative to it) to this location."""
        import pyarrow.fs as pafs

        names = files if files is not None else [str(p.relative_to(source)) for p in sorted(source.rglob("*"))
                                                 if p.is_file()]  # fmt: skip
        for name in names:
            target = self / name
            if self.is_local:
                Path(target.url).parent.mkdir(parents=True, exist_ok=True)
            self._call(
                "upload to", pafs.copy_files, str(source / name), target._path, _local_fs(), self.fs,
            )  # fmt: skip

    def download_tree(self, target: Path) -> None:
        """Copy everything under this location into the local folder ``target``."""
        target.mkdir(parents=True, exist_ok=True)
        for name, _ in self.files():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_bytes((self / name).read_bytes())


Where = Path | Location | str  # a local folder or file, or an object-store URL: anything Location.of takes

# -- durable local writes -------------------------------------------------------------------


def write_durably(path: Path, data: bytes) -> None:
    """Write ``path`` whole and on disk: a temporary file of this writer's own, ``fsync``, then ``rename(2)``.

    Readers see the old content or the new, never a part, also after a crash. The
    temporary name is this writer's own: two writers of one file (a retried task beside
    its zombie) must not truncate or rename each other's half-written copy.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def fsync_dir(path: Path) -> None:
    """``fsync`` a folder, so that a rename into it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_objects(folder: Location) -> None:
    """Delete every file under ``folder``, one object at a time on an object store.

    Some S3 servers refuse the bulk DeleteObjects request a folder delete sends (s3proxy
    answers INTERNAL_FAILURE); single deletes work everywhere.
    """
    if folder.is_local:
        folder.remove_tree()
        return
    for name, _ in list(folder.files()):
        (folder / name).remove_file()


# -- S3 from the environment -----------------------------------------------------------------


def s3_settings() -> tuple[str | None, str | None, str | None]:
    """``(endpoint, region, access key id)`` from the environment; the SDK's own chain reads the credentials.

    The Parquet folders (pyarrow) and the Iceberg catalog (pyiceberg) both reach S3 through
    this. The key id serves as a cache key only, so a changed identity gets a new client.
    """
    endpoint = os.environ.get(ENDPOINT_ENV) or os.environ.get("AWS_ENDPOINT_URL") or None
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
    if endpoint is not None:
        # S3-compatible servers (s3proxy 2.6, older MinIO) reject the SDK's newer default of
        # checksum trailers on every upload; AWS S3 itself accepts either.
        os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
        os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
    return endpoint, region, os.environ.get("AWS_ACCESS_KEY_ID")


@lru_cache(maxsize=1)
def _local_fs() -> pafs.FileSystem:
    import pyarrow.fs as pafs

    return pafs.LocalFileSystem()


@lru_cache(maxsize=8)
def _s3_fs(endpoint: str | None, region: str | None, key_id: str | None) -> pafs.FileSystem:
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(
        endpoint_override=endpoint,
        region=region or "us-east-1",
        scheme=endpoint.split("://", 1)[0] if endpoint and "://" in endpoint else "https",
        connect_timeout=10,
        request_timeout=60,
    )
