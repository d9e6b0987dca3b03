"""Publishing to an object store (a real S3 endpoint, s3proxy): the manifest is the commit point.

What a reader sees is checked at each stage: an interrupted upload (files, no manifest)
is not published, and the next publish uploads beside it under names of its own (nothing
under a plan folder is deleted but an attempt's own files); a published plan is
published once, and publishing it again writes nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.integration.output.test_sink import _df, _plan, _quarantine_writer, _stage
from tidemark.config.models import Feed
from tidemark.output.parquet import (
    MANIFEST_NAME,
    load_manifest,
    new_staging,
    publish,
    publish_staged,
    published_dir,
    published_files,
    staging_base,
    verify,
)
from tidemark.storage import Location

pytestmark = pytest.mark.spark


def _records(files: list[str], where: Location) -> list[tuple[int, int]]:
    rows: list[tuple[int, int]] = []
    for url in files:
        loc = Location.of(url)
        table = pq.read_table(loc.fs_path, filesystem=where.fs, partitioning=None)
        rows += zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True)
    return sorted(rows)


def test_publish_to_s3_once_and_a_rerun_adds_nothing(spark: Any, s3_prefix: str) -> None:
    feed = Feed(name="sinkfeed", topics=("orders",), group="g", output=f"{s3_prefix}/out")
    plan = _plan()
    out = feed.output_location()

    first = publish(_df(spark, plan), plan, feed)

    final = published_dir(out, plan.plan_id)
    assert not first.reused and first.records == 8 and first.location == final.url
    assert verify(first) == []
    names = [n for n, _ in final.files()]
    assert sorted(names) == sorted([MANIFEST_NAME, *(f.path for f in first.files)])  # no .crc, no _SUCCESS
    assert all(re.fullmatch(r".*/part-\d{5}\.[0-9a-f]{12}\.parquet", f.path) for f in first.files)
    assert len({f.path.split(".")[-2] for f in first.files}) == 1  # named by one attempt
    files = published_files(out)
    assert _records(files, out) == [(p, o) for p in range(2) for o in range(4)]
    before = list(final.files())

    again = publish(_df(spark, plan), plan, feed)

    assert again.reused and again.to_dict() == first.to_dict()
    assert list(final.files()) == before and published_files(out) == files


def test_an_interrupted_upload_is_not_published_and_is_left_aside(spark: Any, s3_prefix: str, tmp_path: Path) -> None:
    feed = Feed(name="sinkfeed", topics=("orders",), group="g", output=f"{s3_prefix}/out")
    plan = _plan()
    out = feed.output_location()
    final = published_dir(out, plan.plan_id)
    # What a publisher that died mid-upload leaves: some data files, no manifest.
    (final / "topic=orders" / "date=2026-03-01" / "part-00007.parquet").write_bytes(b"half a file")

    assert load_manifest(out, plan.plan_id) is None
    assert published_files(out) == []  # readers going by manifests see nothing

    manifest = publish(_df(spark, plan), plan, feed)

    assert not manifest.reused and verify(manifest) == []
    leftover = "topic=orders/date=2026-03-01/part-00007.parquet"
    assert leftover in [n for n, _ in final.files()] and leftover not in [f.path for f in manifest.files]
    assert _records(published_files(out), out) == [(p, o) for p in range(2) for o in range(4)]


def test_staged_publish_to_s3_stages_locally_and_uploads_by_manifest(
    s3_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEMARK_STAGING_DIR", str(tmp_path / "staging"))
    plan = _plan()
    feed = Feed(name=plan.feed, topics=("orders",), group="g", output=f"{s3_prefix}/out")
    out = feed.output_location()
    staging = new_staging(out, plan.plan_id)
    assert staging.root.parent == staging_base(out) and staging_base(out).is_relative_to(tmp_path / "staging")
    _stage(staging.written, "ok", 3)
    _stage(staging.written, "decode-1", 1)

    manifest = publish_staged(staging, plan, feed, outcome_column="_outcome", ok_value="ok",
                              write_quarantine=_quarantine_writer({"decode-1": "decode_error: bad"}),
                              expect_records=3, expect_quarantined=1)  # fmt: skip

    assert (manifest.records, manifest.quarantined) == (3, 1)
    assert not staging.root.exists()
    assert load_manifest(out, plan.plan_id) == manifest
    assert sorted(n for n, _ in published_dir(out, plan.plan_id).files()) == sorted(
        [MANIFEST_NAME, *(f.path for f in manifest.files)]
    )
    assert len(published_files(out)) == 1  # the quarantined file is not a published record file


def test_a_plan_in_hive_folders_on_s3_is_listed_by_its_manifest_with_its_folders(spark: Any, s3_prefix: str) -> None:
    """A value field's partitioning on an object store: the rewritten records are uploaded under their Hive-style
    folders with the attempt's names, the manifest (the commit point) lists them with their folders, a reader of the
    manifest's files finds every record once, and a rerun of the published plan writes nothing."""
    import pyarrow.dataset as ds

    from tidemark.output.partitioning import PartitionField

    plan = _plan()
    feed = Feed(name=plan.feed, topics=("orders",), group="g", output=f"{s3_prefix}/out")
    out = feed.output_location()
    staging = new_staging(out, plan.plan_id)
    _stage(staging.written, "ok", 4)
    by_offset = (lambda url: spark.read.parquet(url), (PartitionField("offset", "identity", "offset"),))

    manifest = publish_staged(staging, plan, feed, outcome_column="_outcome", ok_value="ok",
                              write_quarantine=_quarantine_writer({}), expect_records=4,
                              partitioned=by_offset)  # fmt: skip

    assert sorted(f.path.split("/")[0] for f in manifest.files) == [f"offset={o}" for o in range(4)]
    assert all(re.fullmatch(r"offset=\d/part-\d{5}\.[0-9a-f]{12}\.parquet", f.path) for f in manifest.files)
    assert load_manifest(out, plan.plan_id) == manifest and verify(manifest) == []
    files = published_files(out)
    base = published_dir(out, plan.plan_id).fs_path
    dataset = ds.dataset([Location.of(f).fs_path for f in files], filesystem=out.fs, format="parquet",
                         partitioning=ds.partitioning(flavor="hive"), partition_base_dir=base)  # fmt: skip
    assert sorted(dataset.to_table(columns=["offset"]).column("offset").to_pylist()) == [0, 1, 2, 3]
    with pytest.raises(Exception, match="already published"):
        new_staging(out, plan.plan_id)
