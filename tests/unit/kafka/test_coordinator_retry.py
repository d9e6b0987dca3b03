"""A group coordinator that moved: the adapter asks again through a new admin client (librdkafka caches the old)."""

from __future__ import annotations

from typing import Any

import pytest

from tidemark.errors import KafkaUnavailableError
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection

OFFSETS = {("orders", 0): (5, "m")}


def _adapter(answers: list[str | None], seen: list[Any], timeout_s: float = 5) -> KafkaAdapter:
    """An adapter whose OffsetCommit answers ``answers`` in turn (an error name, or None: committed), noting which
    admin client each attempt went through."""
    adapter = KafkaAdapter(KafkaConnection("127.0.0.1:1"), timeout_s=timeout_s)

    def alter(group: str, offsets: Any) -> dict[tuple[str, int], str | None]:
        seen.append(adapter._admin)
        return {tp: answers.pop(0) if answers else None for tp in offsets}

    adapter._alter_committed = alter  # type: ignore[method-assign]
    return adapter


def test_not_coordinator_is_asked_again_through_a_new_client() -> None:
    seen: list[Any] = []
    adapter = _adapter(["NOT_COORDINATOR", "NOT_COORDINATOR", None], seen)
    assert adapter.alter_committed("g", OFFSETS) == {("orders", 0): None}
    assert len(seen) == 3
    assert seen[1] is not seen[0]  # the first NOT_COORDINATOR: a new client at once
    assert seen[2] is seen[1]  # then at most one new client a second


def test_a_loading_coordinator_is_waited_for_with_the_same_client() -> None:
    seen: list[Any] = []
    adapter = _adapter(["COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_LOAD_IN_PROGRESS", None], seen)
    assert adapter.alter_committed("g", OFFSETS) == {("orders", 0): None}
    assert len(seen) == 3 and seen[0] is seen[1] is seen[2]


def test_a_coordinator_that_never_answers_fails_naming_the_group() -> None:
    adapter = _adapter(["NOT_COORDINATOR"] * 1000, [], timeout_s=1.5)
    with pytest.raises(KafkaUnavailableError, match="OffsetCommit for group 'g': the group coordinator stayed "
                                                    "unavailable for 2s"):  # fmt: skip
        adapter.alter_committed("g", OFFSETS)
