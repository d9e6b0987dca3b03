"""LagTrigger's loop (Kafka and Airflow replaced by stand-ins): what survives a new instance, and when it yields.

Airflow rebuilds a watcher's trigger from its kwargs after a triggerer restart: only the
Asset's state (here a dict-backed store) carries the last firing over.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tidemark.config.models import Feed
from tidemark.orchestration.lag import LagReading
from tidemark.orchestration.lag_trigger import STATE_KEY, LagTrigger


class Store:
    """The Asset's state store as the triggerer hands it over (``aget``/``aset``), kept in a dict."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.values[key] = value


class Probe:
    def __init__(self, readings: list[LagReading]) -> None:
        self.readings = readings

    def read(self, _age: int | None = None) -> LagReading:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    def close(self) -> None:
        pass


def trigger(store: Store, probe: Probe, active: int = 0) -> LagTrigger:
    made = LagTrigger(feed="orders", topics=["orders"], group="g", lag_records=10, min_interval_s=0, check_every_s=0)
    made.asset_state_store = store

    async def fake_probe() -> Probe:
        return probe

    async def fake_active() -> int:
        return active

    made._probe = fake_probe  # type: ignore[method-assign,assignment]
    made.active_runs = fake_active  # type: ignore[method-assign]
    return made


async def first_event(made: LagTrigger, checks: int = 5) -> Any:
    """The first event within ``checks`` checks of a fresh instance, else None."""
    gen = made.run()
    try:
        return await asyncio.wait_for(gen.__anext__(), timeout=0.05 * checks)
    except TimeoutError:
        return None
    finally:
        await gen.aclose()


AT = 1_800_000_000_000


def test_it_fires_records_the_firing_and_a_rebuilt_instance_does_not_fire_again() -> None:
    store = Store()
    reading = LagReading(AT, 50, (), {"orders[0]": 0})
    event = asyncio.run(first_event(trigger(store, Probe([reading]))))
    assert event is not None and event.payload["lag_records"] == 50 and "lag_records 10" in event.payload["reason"]
    assert store.values[STATE_KEY] == {"at_ms": AT, "positions": {"orders[0]": 0}}

    # The triggerer restarts before the run commits: a new instance, the same kwargs, the same Asset state.
    later = LagReading(AT + 5_000, 50, (), {"orders[0]": 0})
    assert asyncio.run(first_event(trigger(store, Probe([later])))) is None

    # Once the run committed (offsets moved), lag past the threshold fires again.
    moved = LagReading(AT + 60_000, 30, (), {"orders[0]": 50})
    assert asyncio.run(first_event(trigger(store, Probe([moved])))) is not None


def test_it_never_fires_while_a_run_is_queued_or_running() -> None:
    reading = LagReading(AT, 500, (), {"orders[0]": 0})
    assert asyncio.run(first_event(trigger(Store(), Probe([reading]), active=1))) is None


def test_the_serialized_kwargs_rebuild_an_equal_trigger() -> None:
    made = LagTrigger(feed="orders", topics=["orders"], group="g", lag_records=10, kafka_conn_id="kafka_prod")
    classpath, kwargs = made.serialize()
    again = LagTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs) and kwargs["kafka_conn_id"] == "kafka_prod"


@pytest.mark.parametrize("stored", [None, {"at_ms": "bad"}, {"at_ms": 1}])
def test_an_unknown_or_partial_stored_state_counts_as_never_fired(stored: Any) -> None:
    store = Store()
    if stored is not None:
        store.values[STATE_KEY] = stored
    reading = LagReading(AT, 50, (), {"orders[0]": 0})
    assert asyncio.run(first_event(trigger(store, Probe([reading])))) is not None


def test_a_pattern_feeds_trigger_carries_its_pattern_through_serialization() -> None:
    feed = Feed(name="orders", group="g", topics={"pattern": r"orders\..*", "exclude": ["orders.dlq"]},
                trigger={"lag_records": 10})  # fmt: skip
    made = LagTrigger.for_feed(feed, "tidemark_kafka")
    classpath, kwargs = made.serialize()
    assert kwargs["topics"] == [] and kwargs["topic_pattern"] == {"pattern": r"orders\..*", "exclude": ["orders.dlq"]}
    assert LagTrigger(**kwargs).serialize() == (classpath, kwargs)
