"""Tidemark's checkpoint store: its own record of the last committed offsets.

Kafka deletes a group's committed offsets after ``offsets.retention.minutes`` without
activity (7 days by default); a batch job that runs less often would then silently fall
back to its reset policy. The checkpoint store remembers, per group and partition, the
offset Tidemark last committed and the plan that committed it, so the planner can resume
from there and say "group offsets expired". It also records which *runs* committed: a
commit belongs to a run, not to a plan id, because two runs at different times may plan
the same ranges (an idle feed, a group whose offsets expired, a group reset back to
offsets it had) and each of them must still commit (``docs/ARCHITECTURE.md``, "Plans,
runs and commits"). The embedded default is SQLite under the state dir;
:class:`CheckpointStore` is the interface another database would implement.
"""

from __future__ import annotations

import fcntl
import hashlib
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from tidemark.errors import CommitError

TP = tuple[str, int]


@dataclass(frozen=True)
class Checkpoint:
    offset: int
    plan_id: str
    committed_at: str


class CheckpointStore(Protocol):
    def get(self, group: str, tps: Iterable[TP]) -> dict[TP, Checkpoint]: ...

    def put(self, group: str, plan_id: str, offsets: Mapping[TP, int], run_id: str) -> None: ...

    def run_committed(self, group: str, run_id: str) -> bool: ...

    def commit_lock(self, group: str, timeout_s: float = 120.0) -> AbstractContextManager[None]:
        """Held while a run commits for ``group``: scheduled runs, backfills and replays take turns."""
        ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    grp TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL,
    next_offset INTEGER NOT NULL, plan_id TEXT NOT NULL, committed_at TEXT NOT NULL,
    PRIMARY KEY (grp, topic, part)
);
CREATE TABLE IF NOT EXISTS committed_runs (
    grp TEXT NOT NULL, run_id TEXT NOT NULL, plan_id TEXT NOT NULL, committed_at TEXT NOT NULL,
    PRIMARY KEY (grp, run_id)
);
"""


class SqliteCheckpointStore:
    """The embedded default: one SQLite file, one transaction per ``put``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as conn, conn:
            conn.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def get(self, group: str, tps: Iterable[TP]) -> dict[TP, Checkpoint]:
        wanted = set(tps)
        with closing(self._connect()) as conn:
            rows = conn.execute(
                "SELECT topic, part, next_offset, plan_id, committed_at FROM checkpoints WHERE grp = ?", (group,)
            ).fetchall()
        return {(t, p): Checkpoint(o, pid, at) for t, p, o, pid, at in rows if (t, p) in wanted}

    def put(self, group: str, plan_id: str, offsets: Mapping[TP, int], run_id: str) -> None:
        now = datetime.now(UTC).isoformat()
        with closing(self._connect()) as conn, conn:
            conn.executemany(
                "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (grp, topic, part) DO UPDATE SET "
                "next_offset = excluded.next_offset, plan_id = excluded.plan_id, committed_at = excluded.committed_at",
                [(group, t, p, o, plan_id, now) for (t, p), o in offsets.items()],
            )
            conn.execute("INSERT OR IGNORE INTO committed_runs VALUES (?, ?, ?, ?)", (group, run_id, plan_id, now))

    def commit_lock(self, group: str, timeout_s: float = 120.0) -> AbstractContextManager[None]:
        """A lock file per group beside the database (SQLite is one machine's store anyway)."""
        name = hashlib.sha256(group.encode()).hexdigest()[:24]
        return _file_lock(self.path.with_name(f"{self.path.name}.locks") / f"{name}.lock", timeout_s,
                          f"group '{group}'")  # fmt: skip

    def run_committed(self, group: str, run_id: str) -> bool:
        with closing(self._connect()) as conn:
            row = conn.execute("SELECT 1 FROM committed_runs WHERE grp = ? AND run_id = ?", (group, run_id)).fetchone()
        return row is not None


@contextmanager
def _file_lock(path: Path, timeout_s: float, what: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CommitError(
                        f"another run has been committing for {what} for over {timeout_s:.0f}s "
                        f"(lock {path}); rerun once it finished"
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def default_store() -> SqliteCheckpointStore:
    from tidemark.config import state_dir

    return SqliteCheckpointStore(state_dir() / "checkpoints.sqlite")
