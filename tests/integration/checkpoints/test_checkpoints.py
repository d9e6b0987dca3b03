"""Both checkpoint stores against real databases: SQLite files and a real PostgreSQL server.

The commit lock is checked across processes, as it is used: a second process holding a
group's lock keeps this one out, other groups stay free, and a holder that dies (even
by SIGKILL) releases it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tidemark.checkpoints.store import (
    URL_ENV,
    Checkpoint,
    CheckpointStore,
    PostgresCheckpointStore,
    SqliteCheckpointStore,
    open_store,
)
from tidemark.errors import CommitError, ConfigError, StateStoreError
from tidemark.redaction import redact_url

pytestmark = pytest.mark.integration

HOLDER = """
import sys, time
from pathlib import Path
from tidemark.checkpoints.store import open_store

group, marker, release = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
with open_store().commit_lock(group, timeout_s=60):
    marker.write_text("held")
    while not release.exists():
        time.sleep(0.05)
marker.write_text("released")
"""


def store_url(store: CheckpointStore, postgres_url: str | None) -> str:
    """The URL another process opens the same store with."""
    if isinstance(store, SqliteCheckpointStore):
        return f"sqlite:///{store.path}"
    assert postgres_url is not None
    return postgres_url


@pytest.fixture
def group() -> str:
    return f"g-cp-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def other_url(checkpoint_store: CheckpointStore, request: pytest.FixtureRequest) -> str:
    pg = request.getfixturevalue("postgres") if isinstance(checkpoint_store, PostgresCheckpointStore) else None
    return store_url(checkpoint_store, pg)


class Holder:
    """Another process holding ``group``'s commit lock until released or killed."""

    def __init__(self, url: str, group: str, work: Path) -> None:
        self.marker, self.release_file = work / f"{group}.marker", work / f"{group}.release"
        env = {**os.environ, URL_ENV: url}  # the URL (and its password) travels in the env, not argv
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, group, str(self.marker), str(self.release_file)], env=env
        )
        deadline = time.monotonic() + 60
        while not (self.marker.exists() and self.marker.read_text() == "held"):
            assert self.proc.poll() is None, "the lock holder exited before taking the lock"
            assert time.monotonic() < deadline, "the lock holder never took the lock"
            time.sleep(0.05)

    def release(self) -> None:
        self.release_file.touch()
        assert self.proc.wait(timeout=60) == 0
        assert self.marker.read_text() == "released"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)


@pytest.fixture
def holder(other_url: str, group: str, tmp_path: Path) -> Iterator[Holder]:
    held = Holder(other_url, group, tmp_path)
    try:
        yield held
    finally:
        if held.proc.poll() is None:
            held.kill()


def test_put_get_and_committed_runs(checkpoint_store: CheckpointStore, group: str) -> None:
    assert checkpoint_store.get(group, [("t", 0)]) == {}
    checkpoint_store.put(group, "plan-a", {("t", 0): 5, ("t", 1): 7, ("u", 0): 0}, "run-1")
    checkpoint_store.put(group, "plan-b", {("t", 0): 9}, "run-2")
    checkpoint_store.put(group, "plan-b", {("t", 0): 9}, "run-2")  # a repeated put changes nothing

    got = checkpoint_store.get(group, [("t", 0), ("t", 1), ("t", 2)])
    assert {tp: (c.offset, c.plan_id) for tp, c in got.items()} == {("t", 0): (9, "plan-b"), ("t", 1): (7, "plan-a")}
    assert checkpoint_store.run_committed(group, "run-1") and checkpoint_store.run_committed(group, "run-2")
    assert not checkpoint_store.run_committed(group, "run-3")
    assert not checkpoint_store.run_committed(f"{group}-other", "run-1")
    assert checkpoint_store.get(f"{group}-other", [("t", 0)]) == {}


def test_offsets_beyond_32_bits_round_trip(checkpoint_store: CheckpointStore, group: str) -> None:
    checkpoint_store.put(group, "plan-a", {("t", 0): 2**40 + 3}, "run-1")
    assert checkpoint_store.get(group, [("t", 0)])[("t", 0)].offset == 2**40 + 3


def test_another_process_holding_the_lock_keeps_this_one_out(
    checkpoint_store: CheckpointStore, group: str, holder: Holder
) -> None:
    busy = f"another run has been committing for group '{group}'"
    with pytest.raises(CommitError, match=busy), checkpoint_store.commit_lock(group, timeout_s=0.3):
        pytest.fail("took a lock another process holds")
    with checkpoint_store.commit_lock(f"{group}-other", timeout_s=0.3):
        pass  # other groups are not held up

    holder.release()

    with checkpoint_store.commit_lock(group, timeout_s=30):
        pass


def test_this_process_holding_the_lock_keeps_another_out(
    checkpoint_store: CheckpointStore, other_url: str, group: str, tmp_path: Path
) -> None:
    with checkpoint_store.commit_lock(group, timeout_s=5):
        env = {**os.environ, URL_ENV: other_url}
        probe = subprocess.run(
            [sys.executable, "-c",
             "import sys\nfrom tidemark.checkpoints.store import open_store\nfrom tidemark.errors import CommitError\n"
             "try:\n    open_store().commit_lock(sys.argv[1], timeout_s=0.3).__enter__()\n"
             "except CommitError:\n    sys.exit(3)\n", group],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert probe.returncode == 3, probe.stderr


def test_a_killed_holder_releases_the_lock(checkpoint_store: CheckpointStore, group: str, holder: Holder) -> None:
    holder.kill()  # SIGKILL: no unlock ran; the database session (or the file) goes with the process

    with checkpoint_store.commit_lock(group, timeout_s=30):
        pass


def test_open_store_chooses_by_url(tmp_path: Path, postgres: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    assert isinstance(open_store(root=tmp_path), SqliteCheckpointStore)
    assert isinstance(open_store(f"sqlite:///{tmp_path}/x.sqlite"), SqliteCheckpointStore)
    monkeypatch.setenv(URL_ENV, postgres)
    assert isinstance(open_store(root=tmp_path), PostgresCheckpointStore)
    with pytest.raises(ConfigError, match="only postgresql://"):
        open_store("mysql://u:secret-pw@h/db")


def test_a_wrong_password_is_refused_without_showing_it(postgres: str) -> None:
    wrong = postgres.replace("://tidemark:", "://tidemark:not-the-password-42")

    with pytest.raises(StateStoreError) as caught:
        PostgresCheckpointStore(wrong)

    message = str(caught.value)
    assert "not-the-password-42" not in message
    assert "password authentication failed" in message and "127.0.0.1" in message and "***" in message
    assert "not-the-password-42" not in redact_url(wrong)


def test_topic_ids_round_trip(checkpoint_store: CheckpointStore, group: str) -> None:
    checkpoint_store.put(group, "plan-a", {("t", 0): 5, ("u", 0): 3}, "run-1", {"t": "id-of-t"})
    got = checkpoint_store.get(group, [("t", 0), ("u", 0)])
    assert {tp: c.topic_id for tp, c in got.items()} == {("t", 0): "id-of-t", ("u", 0): None}
    checkpoint_store.put(group, "plan-b", {("t", 0): 9}, "run-2", {"t": "id-of-new-t"})  # the topic recreated
    assert checkpoint_store.get(group, [("t", 0)])[("t", 0)].topic_id == "id-of-new-t"


OLD_CHECKPOINTS = (
    "CREATE TABLE {table} (grp TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL, "
    "next_offset BIGINT NOT NULL, plan_id TEXT NOT NULL, committed_at TEXT NOT NULL, PRIMARY KEY (grp, topic, part))"
)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_store_made_before_topic_ids_is_migrated(
    kind: str, tmp_path: Path, group: str, request: pytest.FixtureRequest
) -> None:
    """A store with the old checkpoints table keeps its rows (id unknown) and records ids from then on."""
    row = (group, "t", 0, 42, "plan-old", "2026-01-01T00:00:00+00:00")
    if kind == "sqlite":
        import sqlite3

        path = tmp_path / "old.sqlite"
        with sqlite3.connect(path) as conn:
            conn.execute(OLD_CHECKPOINTS.format(table="checkpoints"))
            conn.execute("INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)", row)
        conn.close()
        open_old: Callable[[], CheckpointStore] = lambda: SqliteCheckpointStore(path)  # noqa: E731
    else:
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        url = make_url(request.getfixturevalue("postgres"))
        database = f"old_{uuid.uuid4().hex[:10]}"
        admin = create_engine(url.set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {database}"))
        admin.dispose()
        old_url = url.set(database=database)
        engine = create_engine(old_url.set(drivername="postgresql+psycopg"))
        with engine.begin() as conn:
            conn.execute(text(OLD_CHECKPOINTS.format(table="tidemark_checkpoints")))
            conn.execute(text("INSERT INTO tidemark_checkpoints VALUES (:g, :t, :p, :o, :pid, :at)"),
                         dict(zip(["g", "t", "p", "o", "pid", "at"], row, strict=True)))  # fmt: skip
        engine.dispose()
        open_old = lambda: PostgresCheckpointStore(old_url.render_as_string(hide_password=False))  # noqa: E731

    store = open_old()
    assert store.get(group, [("t", 0)]) == {("t", 0): Checkpoint(42, "plan-old", row[5], None)}
    store.put(group, "plan-new", {("t", 0): 50}, "run-new", {"t": "id-of-t"})
    again = open_old()  # opening a migrated store again changes nothing
    assert again.get(group, [("t", 0)])[("t", 0)].topic_id == "id-of-t"


def test_feed_runs_lists_a_feeds_runs_in_the_states_asked_oldest_first(checkpoint_store: CheckpointStore) -> None:
    """The dead-letter reader asks for a feed's ``shown`` runs; re-drives keep their rows under ``<feed>:redrive``."""
    feed = f"f-{uuid.uuid4().hex[:8]}"
    for run_id, state, who in (("r2", "shown", feed), ("r1", "shown", feed), ("r3", "planned", feed),
                               ("r4", "shown", f"{feed}:redrive")):  # fmt: skip
        checkpoint_store.set_run("g", f"{feed}-{run_id}", feed=who, plan_id=f"p-{run_id}", state=state,  # type: ignore[arg-type]
                                 run_dir=f"/runs/{run_id}")  # fmt: skip
    shown = checkpoint_store.feed_runs(feed, ("shown",))
    assert [r.plan_id for r in shown] == ["p-r1", "p-r2"]
    assert [r.plan_id for r in checkpoint_store.feed_runs(feed, ("planned", "shown"))] == ["p-r1", "p-r2", "p-r3"]
    assert [r.plan_id for r in checkpoint_store.feed_runs(f"{feed}:redrive", ("shown",))] == ["p-r4"]
    assert [r.plan_id for r in checkpoint_store.open_runs(feed)] == ["p-r3"]


def test_a_discard_is_owed_in_the_ledger_until_it_is_done(checkpoint_store: CheckpointStore) -> None:
    """``discarding`` (a given-up run whose discard is under way or was cut short) is open: the next settle finds it;
    ``abandoned`` (discarded) is not."""
    feed = f"f-{uuid.uuid4().hex[:8]}"
    for run_id, state in (("r1", "discarding"), ("r2", "abandoned"), ("r3", "committed")):
        checkpoint_store.set_run("g", f"{feed}-{run_id}", feed=feed, plan_id=f"p-{run_id}", state=state,  # type: ignore[arg-type]
                                 run_dir=f"/runs/{run_id}", detail="refused")  # fmt: skip
    assert [(r.plan_id, r.state) for r in checkpoint_store.open_runs(feed)] == [("p-r1", "discarding"),
                                                                                ("p-r3", "committed")]  # fmt: skip
    checkpoint_store.set_run("g", f"{feed}-r1", feed=feed, plan_id="p-r1", state="abandoned", run_dir="/runs/r1",
                             detail="refused")  # fmt: skip
    assert [r.plan_id for r in checkpoint_store.open_runs(feed)] == ["p-r3"]
    row = checkpoint_store.run("g", f"{feed}-r1")
    assert row is not None and (row.state, row.detail) == ("abandoned", "refused")


def test_a_redrive_record_is_kept_with_its_row_and_never_replaced(checkpoint_store: CheckpointStore) -> None:
    """``plan_redrive`` writes the record and the ``planned`` row together; ``adopt_redrive`` (a re-drive recorded
    before the ledger kept records) adds a missing record only; ``redrive_records`` reads one feed's, by run id."""
    group, feed = f"g-{uuid.uuid4().hex[:8]}", f"f{uuid.uuid4().hex[:8]}"
    checkpoint_store.plan_redrive(group, "r1", feed=f"{feed}:redrive", plan_id="redrive-a", run_dir="/d/r1",
                                  record='{"taken": 1}')  # fmt: skip
    row = checkpoint_store.run(group, "r1")
    assert row is not None and (row.state, row.plan_id, row.feed) == ("planned", "redrive-a", f"{feed}:redrive")
    checkpoint_store.set_run(group, "r1", feed=f"{feed}:redrive", plan_id="redrive-a", state="shown", run_dir="/d/r1")
    checkpoint_store.plan_redrive(group, "r1", feed=f"{feed}:redrive", plan_id="redrive-a", run_dir="/d/r1",
                                  record='{"taken": 2}')  # fmt: skip
    again = checkpoint_store.run(group, "r1")
    assert again is not None and again.state == "shown"  # a repeated call moves nothing back
    checkpoint_store.set_run(group, "r2", feed=f"{feed}:redrive", plan_id="redrive-b", state="shown", run_dir="/d/r2")
    checkpoint_store.set_run(group, "r3", feed=feed, plan_id="p", state="shown", run_dir="/d/r3")
    assert checkpoint_store.redrive_records(group, f"{feed}:redrive") == {"r1": '{"taken": 1}'}
    checkpoint_store.adopt_redrive(group, "r2", '{"taken": 3}')
    checkpoint_store.adopt_redrive(group, "r1", '{"taken": 4}')
    checkpoint_store.adopt_redrive(group, "r3", '{"taken": 5}')  # a run's row: not a re-drive of this feed
    assert checkpoint_store.redrive_records(group, f"{feed}:redrive") == {"r1": '{"taken": 1}', "r2": '{"taken": 3}'}
    assert checkpoint_store.redrive_records(f"{group}-other", f"{feed}:redrive") == {}
