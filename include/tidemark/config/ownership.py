"""What a feed owns, and the rule that no two feeds own the same thing: paths, Iceberg tables and the group.

A feed claims every place it writes (:meth:`tidemark.config.models.Feed.claims`): its output
(an Iceberg feed's table location), the output's siblings (``.pending``, ``.quarantine``,
``.dead_letters``, ``.backfills``, ``.replays``: reserved whatever the format, so a feed named
``orders.pending`` can never land on ``orders``' pending records), ``iceberg.quarantine``,
``masking.keep_raw``, its table and dead-letter table by identifier, and its consumer group.
Two claims of paths clash when they are equal or one lies inside the other (``/out/orders2``
beside ``/out/orders`` does not: a path boundary is a ``/``); tables clash by identifier
(compared without case: Hive and Glue fold it); groups clash when equal. A feed's own
explicitly named paths (``iceberg.quarantine``, ``masking.keep_raw``) must not clash with its
other paths either, and no claimed path may hold the state dir or lie in one of its entries
(:data:`STATE_ENTRIES`).

:func:`clashes` is pure: :func:`tidemark.config.models.scan_feeds` refuses both files of
every clash (neither gets a DAG: nothing says which one owns the place), and
:func:`tidemark.config.models.load_feed` refuses a feed that clashes with another file of
its folder. Why at load: every cleanup (a discard, maintenance's orphan removal) deletes
inside its own feed's places, so two feeds sharing one would delete each other's data.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

ClaimKind = Literal["path", "table", "group"]
# The output's siblings every feed reserves (default pending records, quarantine, dead-letter table, backfills,
# replays): a default path of another feed landing on one of them would share its owner's data.
SIBLINGS = (".pending", ".quarantine", ".dead_letters", ".backfills", ".replays")
# What Tidemark keeps in the state dir (docs/ARCHITECTURE.md, "Storage map"): no feed path may lie in one.
STATE_ENTRIES = ("runs", "plans", "maintenance", "checkpoints.sqlite", "iceberg_catalog.sqlite")


@dataclass(frozen=True)
class Claim:
    """One thing a feed owns: ``field`` is how its feed file names it (``output``, ``iceberg.quarantine``, ...)."""

    feed: str
    field: str
    kind: ClaimKind
    value: str
    explicit: bool = True  # named in the file (not a default or a sibling): checked against the feed's own claims


@dataclass(frozen=True)
class Clash:
    """Two claims that overlap; ``how`` says in which way."""

    first: Claim
    second: Claim
    how: str

    def describe(self, files: dict[str, str] | None = None) -> str:
        where = files or {}
        a, b = self.first, self.second
        name_a = where.get(a.feed, f"feed '{a.feed}'")
        name_b = where.get(b.feed, f"feed '{b.feed}'")
        if a.kind == "group":
            return (
                f"{name_a} and {name_b} both read with consumer group '{a.value}' (field 'group'); a group's "
                "offsets follow one feed's output: give each feed its own group"
            )
        if a.kind == "table":
            return (
                f"{name_a} and {name_b} both own Iceberg table {a.value} ({a.field} of '{a.feed}', {b.field} of "
                f"'{b.feed}'); a table belongs to one feed: name another table in one of the files"
            )
        own = a.feed == b.feed
        subject = f"{name_a}: " if own else f"{name_a} and {name_b} overlap: "
        return (
            f"{subject}{a.field} {a.value} of '{a.feed}' {self.how} {b.field} {b.value} of '{b.feed}'; every path a "
            f"feed writes (its output, the output's siblings {', '.join(SIBLINGS)}, iceberg.quarantine, "
            "masking.keep_raw) is its own: a cleanup of one would delete the other's files. Give each its own place"
        )


def _inside(path: str, base: str) -> bool:
    return path.startswith(base.rstrip("/") + "/")


def path_relation(a: str, b: str) -> str | None:
    """How path ``a`` overlaps path ``b``: ``"is"``, ``"lies inside"``, ``"contains"``, or ``None`` (apart)."""
    if a == b:
        return "is"
    if _inside(a, b):
        return "lies inside"
    if _inside(b, a):
        return "contains"
    return None


def clash(a: Claim, b: Claim) -> Clash | None:
    """The clash of two claims, or ``None`` (claims of different kinds never clash)."""
    if a.kind != b.kind:
        return None
    if a.kind == "group":
        return Clash(a, b, "is") if a.value == b.value else None
    if a.kind == "table":
        return Clash(a, b, "is") if a.value.lower() == b.value.lower() else None
    how = path_relation(a.value, b.value)
    return None if how is None else Clash(a, b, how)


def own_clashes(claims: Sequence[Claim]) -> list[Clash]:
    """A feed's explicitly named paths against its other paths (an ``iceberg.quarantine`` in the table location)."""
    found = []
    for i, a in enumerate(claims):
        for b in claims[i + 1 :]:
            if a.kind == "path" and (a.explicit or b.explicit) and (c := clash(a, b)) is not None:
                found.append(c)
    return found


def clashes(claims: Iterable[Claim]) -> list[Clash]:
    """Every clash between claims of different feeds, each pair of claims once, in the order given."""
    listed = list(claims)
    found = []
    for i, a in enumerate(listed):
        for b in listed[i + 1 :]:
            if a.feed != b.feed and (c := clash(a, b)) is not None:
                found.append(c)
    return found


def state_clashes(claims: Iterable[Claim], state: str) -> list[str]:
    """Paths that hold the state dir ``state`` or lie in one of its entries (:data:`STATE_ENTRIES`)."""
    found = []
    for c in claims:
        if c.kind != "path":
            continue
        if c.value == state or _inside(state, c.value):
            found.append(f"{c.field} {c.value} of '{c.feed}' holds Tidemark's state dir {state}")
            continue
        for entry in (f"{state.rstrip('/')}/{e}" for e in (*STATE_ENTRIES, "output")):
            if c.value == entry or (_inside(c.value, entry) and not entry.endswith("/output")):
                found.append(f"{c.field} {c.value} of '{c.feed}' lies in Tidemark's state dir entry {entry}")
    return found
