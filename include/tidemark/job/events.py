"""The job's report events that are not a window's: gaps in ranges and an output's schema change.

Each is an :class:`~tidemark.planning.plan.Event`, kept as its ``dict`` in ``job.json``'s
``events``; the run report and the task log show them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidemark.output.base import Manifest
from tidemark.planning.plan import Event
from tidemark.spark.stats import RangeStats


def gap_events(stats: Sequence[RangeStats]) -> list[dict[str, Any]]:
    """A ``gap`` event per range with offsets that hold no record the plan's isolation can see.

    Transaction markers, aborted records (under ``read_committed``) and compacted-away
    records leave offsets without a record; they are counted, not failed, and each range
    that has them says so in the report and the run's log, so a gap is never silent.
    """
    events = []
    for s in stats:
        if s.gaps:
            events.append(Event(
                "gap",
                f"{s.topic}[{s.partition}] offsets [{s.start}, {s.end}): {s.gaps} of {s.planned} offsets hold no "
                f"record (transaction markers, aborted or compacted-away records); {s.records} records read, "
                f"offsets {s.first_offset} to {s.last_offset}. Counted, not failed",
                topic=s.topic, partition=s.partition,
                details={"start": s.start, "end": s.end, "gaps": s.gaps, "records": s.records,
                         "first_offset": s.first_offset, "last_offset": s.last_offset},
            ).to_dict())  # fmt: skip
    return events


def table_schema_event(manifest: Manifest) -> dict[str, Any]:
    """A ``table_schema_evolved`` event: the Iceberg table's schema changed in the snapshot that added the plan."""
    changes = list(manifest.extra["schema_changes"])
    table, snapshot = manifest.extra.get("table"), manifest.extra.get("snapshot_id")
    where = f"in snapshot {snapshot}" if snapshot is not None else "in the snapshot the commit step adds"
    return Event(
        "table_schema_evolved",
        f"Iceberg table {table}: {'; '.join(changes)}, {where}, the one adding these records",
        details={"table": table, "snapshot_id": snapshot, "changes": changes},
    ).to_dict()


def output_schema_event(manifest: Manifest) -> dict[str, Any] | None:
    """An ``output_schema_evolved`` event when the plan changed its Parquet output's one schema, else None."""
    found = manifest.extra.get("output_schema") or {}
    changes = list(found.get("changes") or [])
    if not changes:
        return None
    version = found.get("version")
    return Event(
        "output_schema_evolved",
        f"the output's schema is now version {version} ({'; '.join(changes)}), read with {found.get('readers')}; "
        "earlier plans' files read the added columns as null and narrower types widened",
        details={"version": version, "changes": changes, "readers": found.get("readers")},
    ).to_dict()
