"""Tidemark's checkpoint store: its own record of the last committed offsets.

Kafka deletes a group's committed offsets after ``offsets.retention.minutes`` without
activity (7 days by default); a batch job that runs less often would then silently fall
back to its reset policy. The checkpoint store remembers, per group and partition, the
offset Tidemark last committed, the plan that committed it and the id of the topic the
offset belongs to, so the planner can resume from there and say "group offsets expired",
and can tell a topic deleted and recreated under the same name (a new id) from the one
the offset was committed on. It also records which *runs* committed: a
commit belongs to a run, not to a plan id, because two runs at different times may plan
the same ranges (an idle feed, a group whose offsets expired, a group reset back to
offsets it had) and each of them must still commit (``docs/ARCHITECTURE.md``, "Plans,
runs and commits"). The embedded default is SQLite under the state dir (one machine).
Deployments whose Airflow workers share no disk use :class:`PostgresCheckpointStore`,
chosen by URL (``TIDEMARK_CHECKPOINT_URL=postgresql://user:password@host:port/db``, or an
Airflow connection of type postgres): the same tables, and the per-group commit lock is
a PostgreSQL advisory lock held by the committing process's session (released by
PostgreSQL itself if that process dies). A URL's password never appears in messages
(:func:`tidemark.redaction.redact_url`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tidemark._types import TopicPartition as TP
from tidemark.errors import CommitError, ConfigError, StateStoreError
from tidemark.redaction import redact, redact_url
from tidemark.storage import Location

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

URL_ENV = "TIDEMARK_CHECKPOINT_URL"


@dataclass(frozen=True)
class Checkpoint:
    offset: int
    plan_id: str
    committed_at: str
    topic_id: str | None = None  # None: recorded before topic ids were, or the id was unknown


RunState = Literal["planned", "committing", "committed", "shown", "discarding", "abandoned"]
# States a run can still leave: the next run of the feed settles them before planning. ``discarding``: given up,
# its discard owed until done (then ``abandoned``).
OPEN_STATES: tuple[RunState, ...] = ("planned", "committing", "committed", "discarding")


@dataclass(frozen=True)
class LedgerRun:
    """One run's row in the ledger: where the commit protocol left it (``docs/ARCHITECTURE.md``, "The run ledger")."""

    group: str
    run_id: str
    feed: str
    plan_id: str
    state: RunState
    run_dir: str
    updated_at: str
    detail: str | None = None


@dataclass(frozen=True)
class Shown:
    """The end of what the feed's output shows for one partition of one topic id (offsets below it)."""

    position: int
    topic_id: str | None
    run_id: str


class CheckpointStore(Protocol):
    def get(self, group: str, tps: Iterable[TP]) -> dict[TP, Checkpoint]: ...

    def put(
        self,
        group: str,
        plan_id: str,
        offsets: Mapping[TP, int],
        run_id: str,
        topic_ids: Mapping[str, str] | None = None,
    ) -> None:
        """Record ``offsets`` as committed by ``run_id``; ``topic_ids`` names each topic's id (topic → id)."""
        ...

    def run_committed(self, group: str, run_id: str) -> bool: ...

    def commit_lock(self, group: str, timeout_s: float = 120.0) -> AbstractContextManager[None]:
        """Held while a run commits for ``group``: scheduled runs, backfills and replays take turns."""
        ...

    def set_run(
        self,
        group: str,
        run_id: str,
        *,
        feed: str,
        plan_id: str,
        state: RunState,
        run_dir: str,
        detail: str | None = None,
    ) -> None:
        """Record ``run_id``'s state in the ledger (insert or update)."""
        ...

    def run(self, group: str, run_id: str) -> LedgerRun | None:
        """``run_id``'s ledger row, or ``None`` when the ledger never heard of it."""
        ...

    def open_runs(self, feed: str) -> list[LedgerRun]:
        """The runs of ``feed`` in an open state (planned, committing, committed, discarding), oldest first."""
        ...

    def feed_has_runs(self, feed: str) -> bool:
        """Whether the ledger knows any run of ``feed``."""
        ...

    def feed_runs(self, feed: str, states: tuple[RunState, ...]) -> list[LedgerRun]:
        """The runs of ``feed`` in one of ``states``, oldest first (the dead-letter reader asks for ``shown``)."""
        ...

    def shown(self, feed: str) -> dict[TP, Shown]:
        """Per partition, the end of what ``feed``'s output shows."""
        ...

    def plan_redrive(self, group: str, run_id: str, *, feed: str, plan_id: str, run_dir: str, record: str) -> None:
        """In one transaction: re-drive ``run_id``'s record (what it takes, as JSON) and its row, ``planned``."""
        ...

    def adopt_redrive(self, group: str, run_id: str, record: str) -> None:
        """Keep the record of a re-drive whose row exists (written before records were kept here); never replaces."""
        ...

    def redrive_records(self, group: str, feed: str) -> dict[str, str]:
        """The records of the re-drive rows of ``feed`` (its ledger name), by run id."""
        ...

    def advance_shown(self, feed: str, run_id: str, ends: Mapping[TP, int], topic_ids: Mapping[str, str]) -> None:
        """Record that ``feed``'s output now shows up to ``ends`` (a position never moves back on one topic id)."""
        ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    grp TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL,
    next_offset INTEGER NOT NULL, plan_id TEXT NOT NULL, committed_at TEXT NOT NULL, topic_id TEXT,
    PRIMARY KEY (grp, topic, part)
);
CREATE TABLE IF NOT EXISTS committed_runs (
    grp TEXT NOT NULL, run_id TEXT NOT NULL, plan_id TEXT NOT NULL, committed_at TEXT NOT NULL,
    PRIMARY KEY (grp, run_id)
);
CREATE TABLE IF NOT EXISTS runs (
    grp TEXT NOT NULL, run_id TEXT NOT NULL, feed TEXT NOT NULL, plan_id TEXT NOT NULL, state TEXT NOT NULL,
    run_dir TEXT NOT NULL, updated_at TEXT NOT NULL, detail TEXT,
    PRIMARY KEY (grp, run_id)
);
CREATE TABLE IF NOT EXISTS shown (
    feed TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL, position INTEGER NOT NULL, topic_id TEXT,
    run_id TEXT NOT NULL,
    PRIMARY KEY (feed, topic, part)
);
CREATE TABLE IF NOT EXISTS redrives (
    grp TEXT NOT NULL, run_id TEXT NOT NULL, record TEXT NOT NULL,
    PRIMARY KEY (grp, run_id)
);
"""


class SqliteCheckpointStore:
    """The embedded default: one SQLite file, one transaction per ``put``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as conn:
            conn.isolation_level = None
            conn.execute("BEGIN IMMEDIATE")  # one process creates or migrates at a time
            try:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                # Stores made before topic ids were recorded get the column (NULL: id unknown).
                columns = {row[1] for row in conn.execute("PRAGMA table_info(checkpoints)")}
                if "topic_id" not in columns:
                    conn.execute("ALTER TABLE checkpoints ADD COLUMN topic_id TEXT")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def get(self, group: str, tps: Iterable[TP]) -> dict[TP, Checkpoint]:
        wanted = set(tps)
        with closing(self._connect()) as conn:
            rows = conn.execute(
                "SELECT topic, part, next_offset, plan_id, committed_at, topic_id FROM checkpoints WHERE grp = ?",
                (group,),
            ).fetchall()
        return {(t, p): Checkpoint(o, pid, at, tid) for t, p, o, pid, at, tid in rows if (t, p) in wanted}

    def put(
        self,
        group: str,
        plan_id: str,
        offsets: Mapping[TP, int],
        run_id: str,
        topic_ids: Mapping[str, str] | None = None,
    ) -> None:
        now = datetime.now(UTC).isoformat()
        ids = topic_ids or {}
        with closing(self._connect()) as conn, conn:
            conn.executemany(
                "INSERT INTO checkpoints (grp, topic, part, next_offset, plan_id, committed_at, topic_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (grp, topic, part) DO UPDATE SET "
                "next_offset = excluded.next_offset, plan_id = excluded.plan_id, committed_at = excluded.committed_at, "
                "topic_id = excluded.topic_id",
                [(group, t, p, o, plan_id, now, ids.get(t) or None) for (t, p), o in offsets.items()],
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

    def set_run(
        self,
        group: str,
        run_id: str,
        *,
        feed: str,
        plan_id: str,
        state: RunState,
        run_dir: str,
        detail: str | None = None,
    ) -> None:
        now = datetime.now(UTC).isoformat()
        with closing(self._connect()) as conn, conn:
            conn.execute(
                "INSERT INTO runs (grp, run_id, feed, plan_id, state, run_dir, updated_at, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (grp, run_id) DO UPDATE SET state = excluded.state, "
                "updated_at = excluded.updated_at, detail = excluded.detail",
                (group, run_id, feed, plan_id, state, run_dir, now, detail),
            )

    def run(self, group: str, run_id: str) -> LedgerRun | None:
        with closing(self._connect()) as conn:
            row = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE grp = ? AND run_id = ?", (group, run_id)
            ).fetchone()
        return None if row is None else LedgerRun(*row)

    def open_runs(self, feed: str) -> list[LedgerRun]:
        return self.feed_runs(feed, OPEN_STATES)

    def feed_has_runs(self, feed: str) -> bool:
        with closing(self._connect()) as conn:
            return conn.execute("SELECT 1 FROM runs WHERE feed = ? LIMIT 1", (feed,)).fetchone() is not None

    def feed_runs(self, feed: str, states: tuple[RunState, ...]) -> list[LedgerRun]:
        marks = ", ".join("?" for _ in states)
        with closing(self._connect()) as conn:
            rows = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE feed = ? AND state IN ({marks}) ORDER BY run_id",
                (feed, *states),
            ).fetchall()
        return [LedgerRun(*row) for row in rows]

    def shown(self, feed: str) -> dict[TP, Shown]:
        with closing(self._connect()) as conn:
            rows = conn.execute("SELECT topic, part, position, topic_id, run_id FROM shown WHERE feed = ?", (feed,))
            return {(t, p): Shown(o, tid, r) for t, p, o, tid, r in rows.fetchall()}

    def advance_shown(self, feed: str, run_id: str, ends: Mapping[TP, int], topic_ids: Mapping[str, str]) -> None:
        with closing(self._connect()) as conn, conn:
            conn.executemany(
                "INSERT INTO shown (feed, topic, part, position, topic_id, run_id) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (feed, topic, part) DO UPDATE SET position = CASE "
                "WHEN shown.topic_id IS excluded.topic_id THEN max(shown.position, excluded.position) "
                "ELSE excluded.position END, "
                "topic_id = excluded.topic_id, run_id = excluded.run_id",
                [(feed, t, p, o, topic_ids.get(t) or None, run_id) for (t, p), o in ends.items()],
            )

    def plan_redrive(self, group: str, run_id: str, *, feed: str, plan_id: str, run_dir: str, record: str) -> None:
        now = datetime.now(UTC).isoformat()
        with closing(self._connect()) as conn, conn:
            conn.execute(
                "INSERT OR IGNORE INTO redrives (grp, run_id, record) VALUES (?, ?, ?)", (group, run_id, record)
            )
            conn.execute(
                "INSERT INTO runs (grp, run_id, feed, plan_id, state, run_dir, updated_at, detail) "
                "VALUES (?, ?, ?, ?, 'planned', ?, ?, NULL) ON CONFLICT (grp, run_id) DO NOTHING",
                (group, run_id, feed, plan_id, run_dir, now),
            )

    def adopt_redrive(self, group: str, run_id: str, record: str) -> None:
        with closing(self._connect()) as conn, conn:
            conn.execute(
                "INSERT OR IGNORE INTO redrives (grp, run_id, record) VALUES (?, ?, ?)", (group, run_id, record)
            )

    def redrive_records(self, group: str, feed: str) -> dict[str, str]:
        with closing(self._connect()) as conn:
            rows = conn.execute(
                "SELECT r.run_id, r.record FROM redrives r JOIN runs u ON u.grp = r.grp AND u.run_id = r.run_id "
                "WHERE r.grp = ? AND u.feed = ?",
                (group, feed),
            ).fetchall()
        return {str(run_id): str(record) for run_id, record in rows}


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


_RUN_COLUMNS = "grp, run_id, feed, plan_id, state, run_dir, updated_at, detail"

_PG_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS tidemark_checkpoints (
        grp TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL,
        next_offset BIGINT NOT NULL, plan_id TEXT NOT NULL, committed_at TEXT NOT NULL, topic_id TEXT,
        PRIMARY KEY (grp, topic, part))""",
    # Stores made before topic ids were recorded get the column (NULL: id unknown).
    "ALTER TABLE tidemark_checkpoints ADD COLUMN IF NOT EXISTS topic_id TEXT",
    """CREATE TABLE IF NOT EXISTS tidemark_committed_runs (
        grp TEXT NOT NULL, run_id TEXT NOT NULL, plan_id TEXT NOT NULL, committed_at TEXT NOT NULL,
        PRIMARY KEY (grp, run_id))""",
    """CREATE TABLE IF NOT EXISTS tidemark_runs (
        grp TEXT NOT NULL, run_id TEXT NOT NULL, feed TEXT NOT NULL, plan_id TEXT NOT NULL, state TEXT NOT NULL,
        run_dir TEXT NOT NULL, updated_at TEXT NOT NULL, detail TEXT,
        PRIMARY KEY (grp, run_id))""",
    """CREATE TABLE IF NOT EXISTS tidemark_shown (
        feed TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL, position BIGINT NOT NULL, topic_id TEXT,
        run_id TEXT NOT NULL,
        PRIMARY KEY (feed, topic, part))""",
    """CREATE TABLE IF NOT EXISTS tidemark_redrives (
        grp TEXT NOT NULL, run_id TEXT NOT NULL, record TEXT NOT NULL,
        PRIMARY KEY (grp, run_id))""",
)
# Advisory lock keys are one bigint space per database: a fixed key serialises schema
# creation, and commit locks hash the group into it (see _lock_key).
_SCHEMA_LOCK_KEY = 0x7469_6465_6D61_726B  # "tidemark"


def _lock_key(group: str) -> int:
    """A signed 64-bit advisory lock key for ``group``'s commit lock."""
    return int.from_bytes(hashlib.sha256(f"tidemark-commit:{group}".encode()).digest()[:8], "big", signed=True)


class PostgresCheckpointStore:
    """The shared store: two tables in a PostgreSQL database, reached by SQLAlchemy + psycopg 3.

    Every call opens its own short transaction; connections are not pooled, so the store
    is safe to use from forked processes and never holds a connection between calls
    (except the one holding a commit lock). SQLAlchemy is imported inside the methods: the
    SQLite default, every local run's store, never loads it (1.5 s to import, measured).
    """

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url
        from sqlalchemy.pool import NullPool

        parsed = make_url(url)
        if parsed.get_backend_name() not in ("postgresql", "postgres"):
            raise ConfigError(f"checkpoint store URL {redact_url(url)}: expected postgresql://...")
        self._password = parsed.password
        self.url = redact_url(url)
        self.engine: Engine = create_engine(
            parsed.set(drivername="postgresql+psycopg"), poolclass=NullPool,
            connect_args={"connect_timeout": 10, "application_name": "tidemark"},
        )  # fmt: skip
        with self._begin("create its tables") as conn:
            from sqlalchemy import text

            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK_KEY})
            for statement in _PG_SCHEMA:
                conn.execute(text(statement))

    def _error(self, what: str, exc: Exception) -> StateStoreError:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        message = redact(message, {self._password})
        return StateStoreError(
            f"checkpoint store {self.url} could not {what}: {message}. Check that the server is up and that "
            f"{URL_ENV} (or the Airflow connection) names the right host, database and credentials"
        )

    @contextmanager
    def _begin(self, what: str) -> Iterator[Connection]:
        from sqlalchemy.exc import DBAPIError

        try:
            with self.engine.begin() as conn:
                yield conn
        except DBAPIError as exc:
            raise self._error(what, exc) from None

    def get(self, group: str, tps: Iterable[TP]) -> dict[TP, Checkpoint]:
        from sqlalchemy import text

        wanted = set(tps)
        with self._begin("read checkpoints") as conn:
            rows = conn.execute(
                text("SELECT topic, part, next_offset, plan_id, committed_at, topic_id FROM tidemark_checkpoints "
                     "WHERE grp = :g"), {"g": group},
            ).all()  # fmt: skip
        return {(t, p): Checkpoint(o, pid, at, tid) for t, p, o, pid, at, tid in rows if (t, p) in wanted}

    def put(
        self,
        group: str,
        plan_id: str,
        offsets: Mapping[TP, int],
        run_id: str,
        topic_ids: Mapping[str, str] | None = None,
    ) -> None:
        from sqlalchemy import text

        now = datetime.now(UTC).isoformat()
        ids = topic_ids or {}
        rows: list[dict[str, Any]] = [
            {"g": group, "t": t, "p": p, "o": o, "pid": plan_id, "at": now, "tid": ids.get(t) or None}
            for (t, p), o in offsets.items()
        ]
        with self._begin("record a commit") as conn:
            if rows:
                conn.execute(
                    text("INSERT INTO tidemark_checkpoints (grp, topic, part, next_offset, plan_id, committed_at, "
                         "topic_id) VALUES (:g, :t, :p, :o, :pid, :at, :tid) "
                         "ON CONFLICT (grp, topic, part) DO UPDATE SET next_offset = excluded.next_offset, "
                         "plan_id = excluded.plan_id, committed_at = excluded.committed_at, "
                         "topic_id = excluded.topic_id"),
                    rows,
                )  # fmt: skip
            conn.execute(
                text("INSERT INTO tidemark_committed_runs VALUES (:g, :r, :pid, :at) ON CONFLICT DO NOTHING"),
                {"g": group, "r": run_id, "pid": plan_id, "at": now},
            )

    def run_committed(self, group: str, run_id: str) -> bool:
        from sqlalchemy import text

        with self._begin("read committed runs") as conn:
            row = conn.execute(
                text("SELECT 1 FROM tidemark_committed_runs WHERE grp = :g AND run_id = :r"), {"g": group, "r": run_id}
            ).first()
        return row is not None

    def set_run(
        self,
        group: str,
        run_id: str,
        *,
        feed: str,
        plan_id: str,
        state: RunState,
        run_dir: str,
        detail: str | None = None,
    ) -> None:
        from sqlalchemy import text

        now = datetime.now(UTC).isoformat()
        with self._begin("record a run's state") as conn:
            conn.execute(
                text("INSERT INTO tidemark_runs (grp, run_id, feed, plan_id, state, run_dir, updated_at, detail) "
                     "VALUES (:g, :r, :f, :pid, :s, :d, :at, :x) ON CONFLICT (grp, run_id) DO UPDATE SET "
                     "state = excluded.state, updated_at = excluded.updated_at, detail = excluded.detail"),
                {"g": group, "r": run_id, "f": feed, "pid": plan_id, "s": state, "d": run_dir, "at": now, "x": detail},
            )  # fmt: skip

    def run(self, group: str, run_id: str) -> LedgerRun | None:
        from sqlalchemy import text

        with self._begin("read the run ledger") as conn:
            row = conn.execute(
                text(f"SELECT {_RUN_COLUMNS} FROM tidemark_runs WHERE grp = :g AND run_id = :r"),
                {"g": group, "r": run_id},
            ).first()
        return None if row is None else LedgerRun(*row)

    def open_runs(self, feed: str) -> list[LedgerRun]:
        return self.feed_runs(feed, OPEN_STATES)

    def feed_runs(self, feed: str, states: tuple[RunState, ...]) -> list[LedgerRun]:
        from sqlalchemy import bindparam, text

        query = text(
            f"SELECT {_RUN_COLUMNS} FROM tidemark_runs WHERE feed = :f AND state IN :states ORDER BY run_id"
        ).bindparams(bindparam("states", expanding=True))
        with self._begin("read the run ledger") as conn:
            rows = conn.execute(query, {"f": feed, "states": list(states)}).all()
        return [LedgerRun(*row) for row in rows]

    def feed_has_runs(self, feed: str) -> bool:
        from sqlalchemy import text

        with self._begin("read the run ledger") as conn:
            row = conn.execute(text("SELECT 1 FROM tidemark_runs WHERE feed = :f LIMIT 1"), {"f": feed}).first()
        return row is not None

    def shown(self, feed: str) -> dict[TP, Shown]:
        from sqlalchemy import text

        with self._begin("read the shown positions") as conn:
            rows = conn.execute(
                text("SELECT topic, part, position, topic_id, run_id FROM tidemark_shown WHERE feed = :f"), {"f": feed}
            ).all()
        return {(t, p): Shown(o, tid, r) for t, p, o, tid, r in rows}

    def advance_shown(self, feed: str, run_id: str, ends: Mapping[TP, int], topic_ids: Mapping[str, str]) -> None:
        from sqlalchemy import text

        rows = [{"f": feed, "t": t, "p": p, "o": o, "tid": topic_ids.get(t) or None, "r": run_id}
                for (t, p), o in ends.items()]  # fmt: skip
        if not rows:
            return
        with self._begin("record the shown positions") as conn:
            conn.execute(
                text("INSERT INTO tidemark_shown (feed, topic, part, position, topic_id, run_id) "
                     "VALUES (:f, :t, :p, :o, :tid, :r) ON CONFLICT (feed, topic, part) DO UPDATE SET "
                     "position = CASE WHEN tidemark_shown.topic_id IS NOT DISTINCT FROM excluded.topic_id "
                     "THEN GREATEST(tidemark_shown.position, excluded.position) ELSE excluded.position END, "
                     "topic_id = excluded.topic_id, run_id = excluded.run_id"),
                rows,
            )  # fmt: skip

    def plan_redrive(self, group: str, run_id: str, *, feed: str, plan_id: str, run_dir: str, record: str) -> None:
        from sqlalchemy import text

        now = datetime.now(UTC).isoformat()
        with self._begin("record a re-drive") as conn:
            conn.execute(
                text(
                    "INSERT INTO tidemark_redrives (grp, run_id, record) VALUES (:g, :r, :rec) ON CONFLICT DO NOTHING"
                ),
                {"g": group, "r": run_id, "rec": record},
            )
            conn.execute(
                text("INSERT INTO tidemark_runs (grp, run_id, feed, plan_id, state, run_dir, updated_at, detail) "
                     "VALUES (:g, :r, :f, :pid, 'planned', :d, :at, NULL) ON CONFLICT (grp, run_id) DO NOTHING"),
                {"g": group, "r": run_id, "f": feed, "pid": plan_id, "d": run_dir, "at": now},
            )  # fmt: skip

    def adopt_redrive(self, group: str, run_id: str, record: str) -> None:
        from sqlalchemy import text

        with self._begin("record a re-drive") as conn:
            conn.execute(
                text(
                    "INSERT INTO tidemark_redrives (grp, run_id, record) VALUES (:g, :r, :rec) ON CONFLICT DO NOTHING"
                ),
                {"g": group, "r": run_id, "rec": record},
            )

    def redrive_records(self, group: str, feed: str) -> dict[str, str]:
        from sqlalchemy import text

        with self._begin("read the re-drive records") as conn:
            rows = conn.execute(
                text("SELECT r.run_id, r.record FROM tidemark_redrives r JOIN tidemark_runs u "
                     "ON u.grp = r.grp AND u.run_id = r.run_id WHERE r.grp = :g AND u.feed = :f"),
                {"g": group, "f": feed},
            ).all()  # fmt: skip
        return {str(run_id): str(record) for run_id, record in rows}

    def commit_lock(self, group: str, timeout_s: float = 120.0) -> AbstractContextManager[None]:
        """A session-level advisory lock per group, on a connection held for the lock's lifetime."""
        return self._advisory_lock(group, timeout_s)

    @contextmanager
    def _advisory_lock(self, group: str, timeout_s: float) -> Iterator[None]:
        from sqlalchemy import text
        from sqlalchemy.exc import DBAPIError

        key = _lock_key(group)
        try:
            conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except DBAPIError as exc:
            raise self._error(f"take the commit lock of group '{group}'", exc) from None
        try:
            deadline = time.monotonic() + timeout_s
            while not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
                if time.monotonic() > deadline:
                    raise CommitError(
                        f"another run has been committing for group '{group}' for over {timeout_s:.0f}s "
                        f"(advisory lock {key} in {self.url}); rerun once it finished"
                    )
                time.sleep(0.1)
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        except DBAPIError as exc:
            raise self._error(f"hold the commit lock of group '{group}'", exc) from None
        finally:
            conn.close()  # closing the session releases the lock even if the unlock failed


def open_store(url: str | None = None, root: Path | Location | None = None) -> CheckpointStore:
    """The checkpoint store named by ``url``, else by ``TIDEMARK_CHECKPOINT_URL``, else SQLite under ``root``.

    ``postgresql://...`` gives :class:`PostgresCheckpointStore`; ``sqlite:///path`` or no
    URL gives :class:`SqliteCheckpointStore` (``<root or state dir>/checkpoints.sqlite``).
    """
    chosen = url or os.environ.get(URL_ENV) or None
    if chosen is None:
        # The feed models load pydantic (0.8 s to import, measured) for the state dir alone: only the default
        # store, with no URL set, needs it.
        from tidemark.config.models import state_location

        base = Location.of(root) if root is not None else state_location()
        if not base.is_local:
            raise ConfigError(
                f"the state dir {base.url} is on an object store, so the checkpoint store must be shared too: "
                f"set {URL_ENV}=postgresql://user:password@host:port/db (or the Airflow connection)"
            )
        return SqliteCheckpointStore(base.local_path() / "checkpoints.sqlite")
    if chosen.startswith("sqlite:///"):
        return SqliteCheckpointStore(Path(chosen[len("sqlite:///") :]))
    if chosen.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres"):
        return PostgresCheckpointStore(chosen)
    raise ConfigError(
        f"checkpoint store URL {redact_url(chosen)}: only postgresql://user:password@host:port/db and "
        "sqlite:///path are supported"
    )


def default_store() -> CheckpointStore:
    """The store the CLI and the page use: ``TIDEMARK_CHECKPOINT_URL``, else SQLite in the state dir."""
    return open_store()
