"""``tidemark verify`` on the real cluster: a clean feed verifies clean; each defect planted from outside is named.

A string feed with one regex rule (the fault suite's :class:`~tests.faults.harness.FaultEnv`:
good ``v-…`` records and quarantined ``x-…`` ones) runs until idle, on a local Parquet folder
and on an Iceberg table. Then each defect is planted with pyarrow, pyiceberg or the file
system, never through Tidemark, and ``verify`` must exit non-zero naming exactly the topic,
partition and offsets (or the file) of the defect: a record duplicated (one offset, by a file
copied into a second plan folder), a data file deleted, a stray file, a record removed, a
value tampered with, a recorded digest off by one byte. The clean runs before each plant are
the other side of each boundary (no offset duplicated, none missing, every digest equal).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv
from tidemark.cli import main
from tidemark.faults import FAULTS_ENV
from tidemark.runs.verify import VerifyReport, verify_feed

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         request: pytest.FixtureRequest) -> FaultEnv:  # fmt: skip
    env = FaultEnv(kafka, spark, tmp_path, request.node.name[:40])
    env.install(monkeypatch)
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    monkeypatch.setenv("TIDEMARK_BOOTSTRAP_SERVERS", kafka.bootstrap_servers)  # the CLI's connection
    return env


def run_feed(env: FaultEnv) -> None:
    env.produce(30, bad={4, 11})
    env.run_until_idle(3)
    env.produce(24, bad={40})
    env.run_until_idle(3)


def verify(env: FaultEnv) -> VerifyReport:
    return verify_feed(env.feed, connection=env.kafka.connection, root=env.root)


def kinds(report: VerifyReport) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for f in report.findings:
        found.setdefault(f.kind, []).append((f.topic, f.partition, f.offsets) if f.path is None else f.path)
    return found


def plan_folders(env: FaultEnv) -> list[Path]:
    """The published plan folders that hold good records, oldest plan first (by their manifest's time)."""
    folders = [d for d in Path(env.output).iterdir() if d.name.startswith("plan_id=")]
    with_rows = [d for d in folders if data_files(d)]
    return sorted(with_rows, key=lambda d: json.loads((d / "_manifest.json").read_text())["published_at"])


def data_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.parquet") if "_quarantine" not in p.parts)


def first_row(path: Path) -> tuple[str, int, int]:
    """(topic, partition, offset) of the file's first row (the topic from its ``topic=`` folder)."""
    table = pq.read_table(path)
    topic = next(p.split("=", 1)[1] for p in path.parts if p.startswith("topic="))
    return topic, table.column("partition")[0].as_py(), table.column("offset")[0].as_py()


def test_a_clean_parquet_feed_verifies_clean_and_each_planted_defect_is_named(
    fenv: FaultEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    run_feed(fenv)
    report = verify(fenv)
    assert report.findings == [], report.findings
    assert report.kafka_records == 54 and report.output_records == 54
    assert main(["verify", fenv.feed, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["clean"] is True and doc["findings"] == []

    first, second = plan_folders(fenv)[:2]
    victim = data_files(first)[0]
    table = pq.read_table(victim)
    topic, partition, offset = first_row(victim)

    # One record duplicated: a file holding only it, copied into a second plan folder.
    copy = second / victim.relative_to(first).parent / "part-copied.parquet"
    copy.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.slice(0, 1), copy)
    found = kinds(verify(fenv))
    assert found.pop("duplicate") == [(topic, partition, ((offset, offset + 1),))]
    assert found.pop("unowned_file") == [str(copy)]
    assert found == {}
    assert main(["verify", fenv.feed]) == 1
    out = capsys.readouterr().out
    assert f"duplicate: {topic}[{partition}] offsets {offset}" in out
    copy.unlink()
    assert verify(fenv).findings == []

    # A record removed from its file (the rest kept): exactly that offset is missing, the file changed.
    saved = victim.read_bytes()
    pq.write_table(table.slice(1), victim)
    found = kinds(verify(fenv))
    assert found.pop("missing") == [(topic, partition, ((offset, offset + 1),))]
    assert found.pop("changed_file") == [str(victim)]
    assert found == {}

    # A value tampered with: that offset's bytes differ from Kafka's.
    values = table.column("value").to_pylist()
    values[0] = values[0] + "!"
    pq.write_table(table.set_column(table.column_names.index("value"), "value", pa.array(values)), victim)
    found = kinds(verify(fenv))
    assert found.pop("value_differs") == [(topic, partition, ((offset, offset + 1),))]
    assert found.pop("changed_file") == [str(victim)]
    assert found == {}
    victim.write_bytes(saved)
    assert verify(fenv).findings == []

    # A data file deleted: the file is named, and every offset it held is missing.
    held = sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
    victim.unlink()
    found = kinds(verify(fenv))
    assert found.pop("missing_file") == [str(victim)]
    missing = found.pop("missing")
    assert {t for t, _, _ in missing} == {topic}
    assert sorted((p, o) for _, p, spans in missing for s, e in spans for o in range(s, e)) == held
    assert found == {}
    victim.write_bytes(saved)

    # Stray files: beside the plans, inside a plan folder, and a pending folder of a run the ledger never had.
    strays = [Path(fenv.output) / "notes.txt", first / "extra.json", Path(fenv.output) / "_pending" / "r0" / "x.bin"]
    for stray in strays:
        stray.parent.mkdir(parents=True, exist_ok=True)
        stray.write_text("stray")
    found = kinds(verify(fenv))
    assert sorted(found.pop("unowned_file")) == sorted(map(str, strays))
    assert found == {}
    for stray in strays:
        stray.unlink()
    shutil.rmtree(Path(fenv.output) / "_pending")

    # A recorded digest one byte off (the manifest edited): that range is named, with both digests.
    manifest = first / "_manifest.json"
    doc = json.loads(manifest.read_text())
    r = next(r for r in doc["ranges"] if r["records"])
    r["bytes"] += 1
    manifest.write_text(json.dumps(doc))
    found = kinds(verify(fenv))
    assert found.pop("digest_differs") == [(r["topic"], r["partition"], ((r["start"], r["end"]),))]
    assert found == {}
    r["bytes"] -= 1
    manifest.write_text(json.dumps(doc))
    assert verify(fenv).findings == []


def test_a_clean_iceberg_feed_verifies_clean_and_each_planted_defect_is_named(fenv: FaultEnv) -> None:
    from pyiceberg.expressions import And, EqualTo

    from tidemark.output.iceberg import IcebergPublisher

    fenv.use_iceberg(f"tidemark.verify_{fenv.topic.replace('-', '_').replace('.', '_')}")
    run_feed(fenv)
    assert verify(fenv).findings == []

    publisher = IcebergPublisher(__import__("tidemark.config.models", fromlist=["load_feed"]).load_feed(fenv.feed))
    table = publisher.load()
    assert table is not None
    files = [t.file.file_path for t in table.scan().plan_files()]
    victim = Path(files[0].removeprefix("file:").removeprefix("//"))
    rows = pq.read_table(victim)
    topic, partition, offset = rows.column("topic")[0].as_py(), rows.column("partition")[0].as_py(), \
        rows.column("offset")[0].as_py()  # fmt: skip

    # A stray file inside the table's location: owned by nothing.
    stray = victim.parent / "stray.parquet"
    stray.write_bytes(b"stray")
    found = kinds(verify(fenv))
    assert found.pop("unowned_file") == [str(stray)]
    assert found == {}
    stray.unlink()

    # A value tampered with in place.
    saved = victim.read_bytes()
    values = rows.column("value").to_pylist()
    values[0] = values[0] + "!"
    pq.write_table(rows.set_column(rows.column_names.index("value"), "value", pa.array(values)), victim)
    found = kinds(verify(fenv))
    assert found.pop("value_differs") == [(topic, partition, ((offset, offset + 1),))]
    assert found == {}
    victim.write_bytes(saved)
    assert verify(fenv).findings == []

    # The table rolled back past its last plan with records: the ledger's shown run is named, and its offsets.
    from tidemark.output.iceberg import PLAN_KEY, RANGES_KEY, RUN_KEY, plan_history

    def ranges_of(snapshot: Any) -> list[dict[str, Any]]:
        return list(json.loads((snapshot.summary or {}).get(RANGES_KEY) or "[]"))

    history = plan_history(table)
    last = next(h for h in history if any(r["end"] > r["start"] for r in ranges_of(h)))
    before = history[history.index(last) + 1]
    head = table.current_snapshot()
    assert head is not None and last.summary is not None
    table.manage_snapshots().set_current_snapshot(before.snapshot_id).commit()
    found = kinds(verify(fenv))
    assert len(found.pop("missing_publication")) == 1
    lost = {(t, p, s) for t, p, spans_ in found.pop("missing") for s in spans_}
    ranges = ranges_of(last)
    assert lost == {(r["topic"], r["partition"], (r["start"], r["end"])) for r in ranges if r["end"] > r["start"]}
    # Its quarantine folder beside the table belongs to no plan the table shows now.
    folder = f"{publisher.quarantine_folder(last.summary[PLAN_KEY], last.summary.get(RUN_KEY))}/"
    assert all(str(path).startswith(folder) for path in found.pop("unowned_file", []))
    assert found == {}
    table = publisher.load()
    assert table is not None
    table.manage_snapshots().set_current_snapshot(head.snapshot_id).commit()
    assert verify(fenv).findings == []
    table = publisher.load()
    assert table is not None

    # One record deleted through pyiceberg (a new snapshot naming no plan): exactly its offset is missing.
    table.delete(And(EqualTo("partition", partition), EqualTo("offset", offset)))  # type: ignore[call-arg,arg-type]
    found = kinds(verify(fenv))
    assert found.pop("missing") == [(topic, partition, ((offset, offset + 1),))]
    assert found == {}

    # A data file the current snapshot references, deleted: the file is named.
    table = publisher.load()
    assert table is not None
    current = Path(next(t.file.file_path for t in table.scan().plan_files()).removeprefix("file:").removeprefix("//"))
    held = pq.read_table(current).column("offset")
    current.unlink()
    found = kinds(verify(fenv))
    assert str(current) in found.pop("missing_file")
    assert pc.min(held).as_py() is not None


def test_dead_letters_the_ledger_and_the_output_disagree_on_are_named(fenv: FaultEnv) -> None:
    """A re-drive publishes the dead letters a fixed rule passes (``tests/integration/runs/test_redrive.py``'s feed):
    verify is clean. Then, from outside, the run ledger loses the re-drive's record (the listing offers its letters
    again, the output holds them re-driven): ``dead_letter_listed_and_redriven``; and, with the record back, the
    re-drive's publication leaves the output (the ledger says it took them, nothing shows them):
    ``dead_letter_unlisted``. Each names exactly the re-driven offsets, and is clean again once undone."""
    import sqlite3

    from tests.integration.runs.test_redrive import FIXED_RULE
    from tests.support.poison import produce_with_poison
    from tidemark.output.deadletters import REDRIVE_FILE, dead_letters
    from tidemark.runs.redrive import redrive_feed

    produce_with_poison(fenv, 30)
    fenv.run()
    fenv.write_feed(validation=FIXED_RULE)
    first = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (first.state, first.published) == ("shown", 3)
    assert verify(fenv).findings == []
    by_tp: dict[tuple[str, int], list[int]] = {}
    for d in dead_letters(fenv.feed, redriven_too=True):
        if d.redriven_by:
            by_tp.setdefault((d.topic, d.partition), []).append(d.offset)
    assert sum(len(v) for v in by_tp.values()) == 3
    taken = sorted((t, p, tuple((o, o + 1) for o in sorted(offsets))) for (t, p), offsets in by_tp.items())

    def joined(found: list[Any]) -> list[Any]:  # findings' spans, one per offset, to compare with `taken`
        return sorted((t, p, tuple((o, o + 1) for s, e in spans_ for o in range(s, e))) for t, p, spans_ in found)

    # The ledger forgets what the re-drive took (its record, and the copy in its run dir).
    db_path = Path(str(fenv.root)) / "checkpoints.sqlite"
    with sqlite3.connect(db_path) as db:
        kept = db.execute("SELECT * FROM redrives").fetchall()
        db.execute("DELETE FROM redrives")
    copy = Path(str(fenv.root)) / "runs" / fenv.feed / str(first.run_id) / REDRIVE_FILE
    aside = copy.with_name("aside.json")
    copy.rename(aside)
    found = kinds(verify(fenv))
    assert joined(found.pop("dead_letter_listed_and_redriven")) == taken
    assert found == {}
    with sqlite3.connect(db_path) as db:
        db.executemany(f"INSERT INTO redrives VALUES ({', '.join('?' * len(kept[0]))})", kept)
    aside.rename(copy)
    assert verify(fenv).findings == []

    # The re-drive's publication leaves the output: the letters it took are neither listed nor re-driven.
    folder = Path(str(fenv.output)) / f"plan_id={first.redrive_id}"
    moved = fenv.tmp / "moved-away"  # outside the output (inside, its files would be owned by nothing)
    folder.rename(moved)
    found = kinds(verify(fenv))
    assert joined(found.pop("dead_letter_unlisted")) == taken
    assert len(found.pop("missing_publication")) == 1  # the re-drive, recorded shown, its plan not in the output
    assert found == {}
    moved.rename(folder)
    assert verify(fenv).findings == []


def test_an_iceberg_feed_verifies_clean_after_a_redrive(fenv: FaultEnv) -> None:
    """The table holds the re-driven dead letters beside the plans' records, and their plan's quarantine folder
    keeps them: verify tells them apart by the snapshot that added their files, so they are neither held twice nor
    unlisted dead letters."""
    from tests.integration.runs.test_redrive import FIXED_RULE
    from tests.support.poison import produce_with_poison
    from tidemark.runs.redrive import redrive_feed

    fenv.use_iceberg(f"tidemark.vr_{fenv.topic.replace('-', '_').replace('.', '_')}")
    produce_with_poison(fenv, 30)
    fenv.run()
    assert verify(fenv).findings == []
    fenv.write_feed(validation=FIXED_RULE)
    first = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (first.state, first.published) == ("shown", 3)
    assert [(f.kind, f.message) for f in verify(fenv).findings] == []


# -- a verify scoped to one plan (the feed DAG's verify task) -------------------------------------


def manifest_of(folder: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((folder / "_manifest.json").read_text())
    return doc


def holder(folder: Path, partition: int, offset: int) -> Path:
    """The data file of ``folder`` holding the record at ``partition``/``offset``."""
    for path in data_files(folder):
        table = pq.read_table(path, columns=["partition", "offset"])
        if (partition, offset) in zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                                      strict=True):  # fmt: skip
            return path
    raise AssertionError(f"no data file of {folder} holds [{partition}]@{offset}")


def at(table: pa.Table, partition: int, offset: int) -> Any:
    return pc.and_(pc.equal(table.column("partition"), partition), pc.equal(table.column("offset"), offset))


def three_plans(env: FaultEnv) -> tuple[Path, Path, Path, str, dict[tuple[str, int], tuple[int, int]]]:
    """Three plans with records (a quarantined one in the middle plan): the folders, oldest first, the middle
    plan's id and its non-empty ranges."""
    env.produce(30, bad={4, 11})
    env.run_until_idle(3)
    env.produce(24, bad={40})
    env.run_until_idle(3)
    env.produce(15)
    env.run_until_idle(3)
    before, middle, after = plan_folders(env)
    ranges = {(r["topic"], r["partition"]): (r["start"], r["end"]) for r in manifest_of(middle)["ranges"]
              if r["end"] > r["start"]}  # fmt: skip
    return before, middle, after, middle.name.removeprefix("plan_id="), ranges


def scoped(env: FaultEnv, plan: str) -> VerifyReport:
    return verify_feed(env.feed, connection=env.kafka.connection, root=env.root, plan=plan)


def test_a_verify_scoped_to_a_plan_reads_only_its_ranges_and_names_the_faults_inside_them(
    fenv: FaultEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    """The middle plan P of three: the scoped verify reads from Kafka exactly P's range sizes and says its scope;
    a record removed or a value changed at P's first and last offsets (start inclusive, end - 1) is named by it,
    one at the offset before P's start or at P's end (the neighbouring plans') only by the whole-feed verify."""
    before, middle, after, plan, ranges = three_plans(fenv)
    whole = verify(fenv)
    assert whole.findings == [] and whole.kafka_records == 69
    report = scoped(fenv, plan)
    assert report.findings == [], report.findings
    assert report.plan == plan
    assert report.kafka_records == sum(e - s for s, e in ranges.values()) == report.output_records
    assert report.kafka_records < whole.kafka_records
    assert [p["partition"] for p in report.partitions] == sorted(p for _, p in ranges)
    shown = ", ".join(f"{t}[{p}] [{s}, {e})" for (t, p), (s, e) in sorted(ranges.items()))
    assert any(f"plan {plan}: its ranges {shown};" in n for n in report.notes), report.notes
    assert main(["verify", fenv.feed, "--plan", plan, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["plan"], doc["clean"], doc["kafka_records"]) == (plan, True, report.kafka_records)
    assert main(["verify", fenv.feed, "--plan", "no-such-plan"]) == 2
    capsys.readouterr()

    (topic, partition), (start, end) = sorted(ranges.items())[0]
    cases = ((middle, start, True), (middle, end - 1, True), (before, start - 1, False), (after, end, False))
    for folder, offset, inside in cases:
        path = holder(folder, partition, offset)
        saved, table = path.read_bytes(), pq.read_table(path)
        one = [(topic, partition, ((offset, offset + 1),))]
        # The record removed from its file.
        pq.write_table(table.filter(pc.invert(at(table, partition, offset))), path)
        expected = {"missing": one, "changed_file": [str(path)]}
        assert kinds(scoped(fenv, plan)) == (expected if inside else {}), (offset, inside)
        assert kinds(verify(fenv)) == expected, offset
        # Its value changed.
        values = table.column("value").to_pylist()
        row = at(table, partition, offset).to_pylist().index(True)
        values[row] = values[row] + "!"
        pq.write_table(table.set_column(table.column_names.index("value"), "value", pa.array(values)), path)
        expected = {"value_differs": one, "changed_file": [str(path)]}
        assert kinds(scoped(fenv, plan)) == (expected if inside else {}), (offset, inside)
        assert kinds(verify(fenv)) == expected, offset
        path.write_bytes(saved)
    assert scoped(fenv, plan).findings == [] and verify(fenv).findings == []


def test_a_verify_scoped_to_a_plan_finds_a_duplicate_in_a_plan_overlapping_it_by_one_offset(fenv: FaultEnv) -> None:
    """The next plan's manifest claims one offset of P (P's last) and holds a copy of its record: the scoped verify
    reads that plan's rows because its recorded range meets P's, and names the duplicate. A copy of the next plan's
    first record (P's end, outside P) in the plan before P is named only by the whole-feed verify (the copy itself
    is a file owned by nothing for both: the listing stays whole)."""
    before, middle, after, plan, ranges = three_plans(fenv)
    (topic, partition), (_, end) = sorted(ranges.items())[0]

    def copy_into(target: Path, source: Path, offset: int, name: str = "part-copied.parquet") -> Path:
        table = pq.read_table(holder(source, partition, offset))
        copy = target / holder(source, partition, offset).relative_to(source).parent / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.filter(at(table, partition, offset)), copy)
        return copy

    copy = copy_into(after, middle, end - 1)
    saved = (after / "_manifest.json").read_text()
    doc = manifest_of(after)
    claimed = next(r for r in doc["ranges"] if (r["topic"], r["partition"]) == (topic, partition))
    assert claimed["start"] == end
    claimed["start"] = end - 1  # overlapping P by one offset
    (after / "_manifest.json").write_text(json.dumps(doc))
    # That plan also holds its own first record (P's end) twice: outside P, named by the whole-feed verify only.
    again = copy_into(after, after, end, "part-again.parquet")
    assert kinds(scoped(fenv, plan)) == {"duplicate": [(topic, partition, ((end - 1, end),))],
                                         "unowned_file": sorted([str(copy), str(again)])}  # fmt: skip
    found = kinds(verify(fenv))
    assert found.pop("duplicate") == [(topic, partition, ((end - 1, end + 1),))]
    assert sorted(found.pop("unowned_file")) == sorted([str(copy), str(again)])
    assert found.pop("digest_differs") == [(topic, partition, ((end - 1, claimed["end"]),))]  # one record more
    assert found == {}
    (after / "_manifest.json").write_text(saved)
    copy.unlink()
    again.unlink()

    copy = copy_into(before, after, end)
    assert kinds(scoped(fenv, plan)) == {"unowned_file": [str(copy)]}
    assert kinds(verify(fenv)) == {"duplicate": [(topic, partition, ((end, end + 1),))], "unowned_file": [str(copy)]}
    copy.unlink()
    assert scoped(fenv, plan).findings == [] and verify(fenv).findings == []

    # A plan's publication gone from the output: the scoped verify of another plan does not look for it.
    for folder, inside in ((before, False), (middle, True)):
        folder.rename(fenv.tmp / "moved-away")  # outside the output
        found = kinds(scoped(fenv, plan))
        assert (len(found.pop("missing_publication", [])), bool(found.pop("missing", []))) == (inside, inside)
        assert found == {}
        found = kinds(verify(fenv))
        assert len(found.pop("missing_publication")) == 1 and found.pop("missing") and found == {}
        (fenv.tmp / "moved-away").rename(folder)


def test_the_feed_dags_verify_task_audits_its_runs_plan_only(fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The DAG's ``verify`` task, handed the last run's plan: it reads from Kafka that plan's records only (its
    log lines, recorded as the task writes them)."""
    from tidemark.orchestration import dags

    lines: list[str] = []

    class Recorded:
        def info(self, message: str, *args: Any) -> None:
            lines.append(message % args)

        warning = error = info

    fenv.produce(30)
    fenv.run_until_idle(3)
    fenv.produce(12)
    handle, _, outcome = fenv.run()
    assert handle.records == 12 and outcome.committed
    monkeypatch.setattr(dags, "log", Recorded())
    dags.verify_step.function(handle.to_xcom(), {})
    assert any(m.startswith(f"verify: scoped to plan {handle.plan_id}: ") for m in lines), lines
    assert any(m.startswith("verify: 12 records read from Kafka, 12 in the output") for m in lines), lines


def test_an_iceberg_verify_scoped_to_a_plan_reads_its_rows_through_a_row_filter(fenv: FaultEnv) -> None:
    """An Iceberg feed's middle plan: the scoped verify reads from Kafka its range sizes and is clean; a record of
    the plan deleted through pyiceberg (its first offset) is named by it, one of the next plan (the plan's end) only
    by the whole-feed verify."""
    from pyiceberg.expressions import And, EqualTo

    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher, plan_history

    fenv.use_iceberg(f"tidemark.vs_{fenv.topic.replace('-', '_').replace('.', '_')}")
    fenv.produce(30)
    fenv.run_until_idle(3)
    fenv.produce(24)
    handle, _, _ = fenv.run()
    fenv.produce(15)
    fenv.run_until_idle(3)
    publisher = IcebergPublisher(load_feed(fenv.feed))
    table = publisher.load()
    assert table is not None
    ranges = next(json.loads(s.summary["tidemark.ranges"]) for s in plan_history(table)
                  if s.summary is not None and s.summary.get("tidemark.plan-id") == handle.plan_id)  # fmt: skip
    (topic, partition, start, end) = next((r["topic"], r["partition"], r["start"], r["end"]) for r in ranges
                                          if r["end"] > r["start"])  # fmt: skip
    report = scoped(fenv, handle.plan_id)
    assert report.findings == [] and report.kafka_records == 24 == report.output_records
    for offset, inside in ((end, False), (start, True)):
        table.delete(And(EqualTo("partition", partition), EqualTo("offset", offset)))  # type: ignore[call-arg,arg-type]
        table = publisher.load()
        assert table is not None
        one = {"missing": [(topic, partition, ((offset, offset + 1),))]}
        assert kinds(scoped(fenv, handle.plan_id)) == (one if inside else {}), offset
        whole = kinds(verify(fenv)).get("missing", [])
        assert (topic, partition, offset) in {(t, p, o) for t, p, s_ in whole for s, e in s_ for o in range(s, e)}
