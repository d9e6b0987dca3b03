"""Whose table is it: the ``tidemark.owner`` property a feed's tables carry, and the rule for a table without one.

A feed's data table and dead-letter table are created with ``tidemark.owner = <feed name>``
(:data:`OWNER_KEY`). A feed that opens a table another feed owns is refused, naming the table,
both feeds and the remedy (:func:`check_owner`): a feed file naming another team's table, or a
feed renamed without its table, never writes, lists or maintains it.

**Adoption** of a table without the property (created before owners were recorded, or by
another tool): the feed that opens it adopts it, writing the property in its own
compare-and-set commit (:func:`adopt`), unless the table shows another feed's data: a data
table whose properties hold another feed's ledger (``tidemark.ledger.<other>``), a dead-letter
table holding a row of another feed. Then it is refused until an operator sets the property by
hand. Reading (``published``, positions, the dead-letter listing, maintenance) checks the same
rule and never writes the property.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tidemark.errors import ConfigError

if TYPE_CHECKING:
    from pyiceberg.table import Table

OWNER_KEY = "tidemark.owner"
# tidemark.output.ledger's property prefix, spelled here because the dead-letter table (beside the ledger, not above
# it) imports this module; tests/integration/output/test_table_owner.py checks the two agree.
LEDGER_PREFIX = "tidemark.ledger."
ForeignData = Callable[["Table", str], list[str]]  # a table and the feed opening it: the other feeds it shows


def ledger_feeds(table: Table, feed: str) -> list[str]:
    """The other feeds whose ledger (``tidemark.ledger.<feed>``) is among the table's properties."""
    return sorted(k[len(LEDGER_PREFIX) :] for k in table.properties if k.startswith(LEDGER_PREFIX)
                  and k[len(LEDGER_PREFIX) :] != feed)  # fmt: skip


def check_owner(table: Table, name: str, feed: str, foreign: ForeignData = ledger_feeds) -> bool:
    """Refuse ``table`` (Iceberg table ``name``) to ``feed`` when another feed owns it, or it has no owner and shows
    another feed's data (``foreign``); whether ``feed`` owns it already."""
    owner = table.properties.get(OWNER_KEY)
    if owner == feed:
        return True
    if owner is not None:
        raise ConfigError(
            f"Iceberg table {name} belongs to feed '{owner}' (table property {OWNER_KEY}), not to feed '{feed}': a "
            f"feed never writes, lists or maintains another feed's table. Name a table of its own in feed '{feed}''s "
            "file (iceberg.table, iceberg.dead_letters)"
        )
    others = foreign(table, feed)
    if others:
        raise ConfigError(
            f"Iceberg table {name} has no owner (table property {OWNER_KEY}) and holds data of feed(s) "
            f"{', '.join(repr(o) for o in others)}, so feed '{feed}' does not adopt it. If it is feed '{feed}''s, set "
            f"the property {OWNER_KEY}={feed} on the table; otherwise name a table of its own in the feed file"
        )
    return False


def adopt(table: Table, name: str, feed: str, foreign: ForeignData = ledger_feeds) -> Table:
    """``table`` owned by ``feed``: checked (:func:`check_owner`), and the property written if it had none."""
    if check_owner(table, name, feed, foreign):
        return table
    with table.transaction() as tx:  # a compare-and-set: another feed adopting it meanwhile makes this one fail
        tx.set_properties({OWNER_KEY: feed})
    return table.refresh()
