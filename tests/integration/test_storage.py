"""The storage seam on both backends: a local folder and a real S3 endpoint (s3proxy)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.servers.s3 import LocalS3
from tidemark.errors import ConfigError, StateStoreError
from tidemark.storage import Location

pytestmark = pytest.mark.integration


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    if request.param == "local":
        return Location.of(tmp_path / "store")
    return Location.of(request.getfixturevalue("s3_prefix"))


def test_write_read_list_and_remove(root: Location, tmp_path: Path) -> None:
    assert not (root / "a.json").exists()
    (root / "a.json").write_text('{"x": 1}')
    (root / "sub" / "b.txt").write_text("b")
    (root / "a.json").write_text('{"x": 2}')  # replaced whole

    assert (root / "a.json").read_text() == '{"x": 2}'
    assert (root / "a.json").is_file() and not (root / "sub").is_file()
    assert [c.name for c in root.children()] == ["a.json", "sub"]
    assert [name for name, _ in root.files()] == ["a.json", "sub/b.txt"]

    (root / "sub").remove_tree()
    assert [name for name, _ in root.files()] == ["a.json"]
    assert list((root / "missing").files()) == [] and (root / "missing").children() == []


def test_two_local_writers_of_one_file_each_replace_it_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A retried task and its zombie write one run's ``job.json`` at once: both land, the file is one of them, whole."""
    import os
    import threading

    target = Location.of(tmp_path / "run" / "job.json")
    both_written = threading.Barrier(2, timeout=30)
    fsync = os.fsync

    def fsync_together(fd: int) -> None:
        fsync(fd)
        both_written.wait()  # each writer has its content on disk, neither has renamed it into place

    monkeypatch.setattr(os, "fsync", fsync_together)
    errors: list[BaseException] = []

    def write(text: str) -> None:
        try:
            target.write_text(text)
        except Exception as exc:  # noqa: BLE001 - a writer's failure is the outcome asserted below
            errors.append(exc)

    texts = ['{"attempt": "zombie"}', '{"attempt": "retry", "pad": "' + "x" * 64 + '"}']
    threads = [threading.Thread(target=write, args=(t,)) for t in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and not both_written.broken
    assert target.read_text() in texts
    assert [p.name for p in target.local_path().parent.iterdir()] == ["job.json"]


def test_upload_and_download_a_tree_and_read_parquet_in_place(root: Location, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "topic=t" / "date=2026-01-01").mkdir(parents=True)
    pq.write_table(pa.table({"offset": [1, 2, 3]}), source / "topic=t" / "date=2026-01-01" / "part-0.parquet")
    (source / "_manifest.json").write_text("{}")

    (root / "out").upload_tree(source, ["topic=t/date=2026-01-01/part-0.parquet"])
    assert [n for n, _ in (root / "out").files()] == ["topic=t/date=2026-01-01/part-0.parquet"]
    (root / "out").upload_tree(source)

    out = root / "out"
    table = pq.read_table(out.fs_path, filesystem=out.fs, partitioning="hive")
    assert sorted(table.column("offset").to_pylist()) == [1, 2, 3]
    back = tmp_path / "back"
    out.download_tree(back)
    assert (back / "_manifest.json").read_text() == "{}"


def test_urls_are_checked_and_names_compose() -> None:
    loc = Location.of("s3://bucket//a/b/")
    assert loc.url == "s3://bucket/a/b" and not loc.is_local
    assert (loc / "c").url == "s3://bucket/a/b/c" and loc.parent.url == "s3://bucket/a" and loc.name == "b"
    assert loc.with_name("b.replays").url == "s3://bucket/a/b.replays"
    with pytest.raises(ConfigError, match="only local paths and s3://"):
        Location.of("gs://bucket/x")
    with pytest.raises(ConfigError, match="name a bucket"):
        Location.of("s3://")
    with pytest.raises(ConfigError, match="object-store location"):
        loc.local_path()


def test_wrong_credentials_are_an_error_naming_the_location(
    s3: LocalS3, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-else")
    with pytest.raises(StateStoreError, match=rf"could not look up {s3_prefix}/x"):
        Location.of(f"{s3_prefix}/x").exists()
