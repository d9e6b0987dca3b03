"""One run as its steps pass it on: the handle, the run loaded once per process, and where its files live.

A run's files are in its run dir, ``<state>/runs/<feed>/<run_id>/``: ``plan.json`` (the
plan it started from), ``job.json`` (the job's result), ``report.json`` and ``run.json``
(its status: when it was planned, finished, failed or abandoned, and why). The
:class:`RunHandle` names them and travels through XCom; each step loads the
:class:`Run` it acts on once (:meth:`Run.load`) and hands that value down.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from tidemark.checkpoints.store import CheckpointStore, open_store
from tidemark.config.models import Feed, load_feed, state_location
from tidemark.planning.plan import PLAN_FILE, Plan, read_plan
from tidemark.planning.requests import RunRequest
from tidemark.storage import Location, Where

Root = Where  # the state dir: a local folder or an object-store URL
STATUS_FILE = "run.json"
Progress = Callable[[str], None]  # where a step says what it does (the CLI prints it, a task logs it)


def silent(_: str) -> None:
    """Progress sink that drops messages."""


def runs_root(root: Root | None = None) -> Location:
    """Where every feed's run dirs are: ``<state>/runs`` (``root``, else the state dir)."""
    return (Location.of(root) if root is not None else state_location()) / "runs"


def run_dir_for(feed: str, run_id: str, root: Root | None = None) -> Location:
    return runs_root(root) / feed / run_id


def open_checkpoints(root: Root | None, given: CheckpointStore | None = None) -> CheckpointStore:
    """``given``, else the store ``TIDEMARK_CHECKPOINT_URL`` names, else SQLite under ``root``."""
    return given if given is not None else open_store(root=Location.of(root) if root is not None else state_location())


@dataclass(frozen=True)
class RunHandle:
    """What the steps of one run pass to each other (and through XCom): no secrets."""

    run_id: str
    feed: str
    plan_id: str
    plan_path: str
    run_dir: str
    mode: str
    commit: bool
    records: int
    resumed: str | None = None  # plan id of an earlier run of the feed this run committed or showed first
    dry_run: bool = False  # plan only: nothing is read, published or committed

    @classmethod
    def new(cls, plan: Plan, request: RunRequest, root: Root | None, resumed: str | None) -> RunHandle:
        """The handle of a new run of ``plan``: its id is the time and the plan id's hash's first eight characters."""
        run_id = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}-{plan.plan_id.rpartition('-')[2][:8]}"
        run_dir = run_dir_for(plan.feed, run_id, root)
        return cls(run_id=run_id, feed=plan.feed, plan_id=plan.plan_id, plan_path=str(run_dir / PLAN_FILE),
                   run_dir=str(run_dir), mode=request.mode, commit=plan.commit, records=plan.total_records,
                   resumed=resumed, dry_run=request.dry_run)  # fmt: skip

    def to_xcom(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_xcom(cls, doc: Mapping[str, Any]) -> RunHandle:
        return cls(**doc)

    def plan(self) -> Plan:
        return read_plan(self.plan_path)


@dataclass(frozen=True)
class Run:
    """One run as a step works on it: loaded once per process, then passed down.

    ``request`` is there only in the process that planned the run; the later steps act on
    what the plan recorded of it (mode, commit, window, output).
    """

    handle: RunHandle
    feed: Feed
    plan: Plan
    request: RunRequest | None = None

    @classmethod
    def load(cls, handle: RunHandle) -> Run:
        """The run ``handle`` names, as a later step (another process) finds it: its feed and its saved plan."""
        return cls(handle, load_feed(handle.feed), handle.plan())

    @property
    def dir(self) -> Location:
        return Location.of(self.handle.run_dir)


def run_status(run_dir: Location) -> dict[str, Any]:
    """The run's ``run.json`` (empty before the run is saved)."""
    path = run_dir / STATUS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def write_status(run_dir: Location, **fields: Any) -> None:
    """Add ``fields`` to the run's ``run.json``."""
    doc = {**run_status(run_dir), **fields}
    (run_dir / STATUS_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
