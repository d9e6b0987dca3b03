"""A partition whose leader moved: ListOffsets is asked again through a new admin client (fresh metadata)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from tidemark.errors import KafkaUnavailableError
from tidemark.kafka import adapter as adapter_module
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection


class _Offset:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class _Admin:
    """An admin client whose ListOffsets answers, client after client, come from ``answers`` (an error code, or
    None: offset 42); ``clients`` gets, for each client made, the answers it gave."""

    def __init__(self, answers: list[int | None], clients: list[list[Any]]) -> None:
        self.answers = answers
        self.said: list[Any] = []
        clients.append(self.said)

    def list_offsets(self, requests: dict[Any, Any], **_kwargs: Any) -> dict[Any, Future[Any]]:
        out: dict[Any, Future[Any]] = {}
        for tp in requests:
            answer = self.answers.pop(0) if self.answers else None
            self.said.append(answer)
            future: Future[Any] = Future()
            if answer is None:
                future.set_result(_Offset(42))
            else:
                future.set_exception(KafkaException(KafkaError(answer)))
            out[tp] = future
        return out

    def poll(self, _timeout: float) -> int:
        return 0


def _adapter(monkeypatch: pytest.MonkeyPatch, answers: list[int | None], timeout_s: float = 5) -> list[list[Any]]:
    clients: list[list[Any]] = []
    monkeypatch.setattr(adapter_module, "AdminClient", lambda _config: _Admin(answers, clients))
    monkeypatch.setattr(adapter_module, "RETRY_BACKOFF_S", 0.01)
    return clients


def test_a_fenced_leader_epoch_is_asked_again_through_a_new_client(monkeypatch: pytest.MonkeyPatch) -> None:
    fenced = KafkaError.FENCED_LEADER_EPOCH
    clients = _adapter(monkeypatch, [fenced, fenced, None])
    adapter = KafkaAdapter(KafkaConnection("127.0.0.1:1"))
    assert adapter.end_offsets([("orders", 0)], "read_committed") == {("orders", 0): 42}
    # The first fenced answer: a new client at once; the second, within the second: the same client again.
    assert clients == [[fenced], [fenced, None]]


def test_a_leader_that_stays_fenced_fails_naming_the_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    _adapter(monkeypatch, [KafkaError.FENCED_LEADER_EPOCH] * 100_000)
    adapter = KafkaAdapter(KafkaConnection("127.0.0.1:1"), timeout_s=1.0)
    with pytest.raises(KafkaUnavailableError, match=r"ListOffsets for orders\[3\] failed: .*FENCED_LEADER_EPOCH.*"
                                                    r"kept moving for 1s"):  # fmt: skip
        adapter.log_start_offsets([("orders", 3)])
