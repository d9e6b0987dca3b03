"""free_port: a port nothing uses, outside the range the kernel hands to outgoing connections."""

from __future__ import annotations

import socket

import pytest

from tidemark.devtools.kafka import cluster
from tidemark.devtools.kafka.cluster import LOWEST_PORT, free_port


def test_ports_are_free_and_below_the_ephemeral_range() -> None:
    low = cluster._ephemeral_low()
    ports = [free_port() for _ in range(20)]
    assert all(LOWEST_PORT <= p < low for p in ports), (low, ports)
    assert len(set(ports)) > 1  # chosen at random, not the first free one each time
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over(held_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    other = free_port()
    choices = [held_port, other]
    monkeypatch.setattr(cluster._PORT_CHOICE, "randrange", lambda _a, _b: choices.pop(0))
    assert free_port() == other
    assert choices == []


def test_no_room_below_the_range_falls_back_to_the_kernels_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "_ephemeral_low", lambda: LOWEST_PORT + 10)
    port = free_port()
    assert port >= LOWEST_PORT + 10  # from the kernel's own range
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
