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


class Done(Exception):
    """The probe has no more readings: ends the trigger's loop in a test."""


class Checks:
    """A probe giving ``readings`` one per check (an exception instance is raised instead), then :class:`Done`."""

    def __init__(self, readings: list[LagReading | Exception]) -> None:
        self.readings = list(readings)
        self.closed = 0

    def read(self, _age: int | None = None) -> LagReading:
        if not self.readings:
            raise Done
        item = self.readings.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self.closed += 1


async def events_of(made: LagTrigger) -> list[Any]:
    """Every event one instance yields over all its probe's checks."""
    out = []
    gen = made.run()
    try:
        while True:
            out.append(await gen.__anext__())
    except Done:
        return out


def repeated(store: Store | None, probe: Checks, *, active: int = 0, min_interval_s: float = 0) -> LagTrigger:
    made = trigger(store or Store(), probe, active)  # type: ignore[arg-type]
    made.min_interval_s = min_interval_s
    if store is None:
        made.asset_state_store = None  # memory only
    return made


@pytest.mark.parametrize("stored", [True, False], ids=["asset-state", "memory-only"])
def test_one_instance_through_repeated_checks_fires_once_until_the_offsets_move(stored: bool) -> None:
    """The same lag seen at five checks in a row fires once (the run it started has not committed); once the offsets
    move, lag past the threshold fires once more; then no more while they stay there."""
    store = Store() if stored else None
    same = [LagReading(AT + i * 1000, 50, (), {"orders[0]": 0}) for i in range(5)]
    moved = [LagReading(AT + 10_000 + i * 1000, 40, (), {"orders[0]": 10}) for i in range(4)]
    probe = Checks([*same, *moved])
    events = asyncio.run(events_of(repeated(store, probe)))
    assert [(e.payload["at_ms"], e.payload["lag_records"]) for e in events] == [(AT, 50), (AT + 10_000, 40)]
    assert probe.closed == 1  # the loop's end closes the probe once
    if store is not None:
        assert store.values[STATE_KEY] == {"at_ms": AT + 10_000, "positions": {"orders[0]": 10}}


def test_a_failed_check_is_retried_at_the_next_and_never_ends_the_trigger() -> None:
    from tidemark.errors import KafkaUnavailableError

    reading = LagReading(AT, 50, (), {"orders[0]": 0})
    probe = Checks([KafkaUnavailableError("broker down"), KafkaUnavailableError("again"), reading])
    events = asyncio.run(events_of(repeated(Store(), probe)))
    assert [e.payload["at_ms"] for e in events] == [AT]


def test_active_runs_are_asked_only_when_the_rule_would_fire_and_hold_the_firing() -> None:
    asked: list[int] = []
    below = LagReading(AT, 5, (), {"orders[0]": 0})
    above = LagReading(AT + 1000, 50, (), {"orders[0]": 0})
    made = repeated(Store(), Checks([below, below, above, above]), active=1)

    async def counted() -> int:
        asked.append(1)
        return 1

    made.active_runs = counted  # type: ignore[method-assign]
    assert asyncio.run(events_of(made)) == []
    assert len(asked) == 2  # the two checks above the threshold, not the two below


def test_min_interval_holds_a_second_firing_in_one_instance_until_it_passed() -> None:
    """Offsets moved at once, lag still past the threshold: the second firing waits min_interval (60 s), and comes
    at exactly 60 s, not one second earlier."""
    readings = [LagReading(AT, 50, (), {"orders[0]": 0}), LagReading(AT + 59_000, 50, (), {"orders[0]": 5}),
                LagReading(AT + 60_000, 50, (), {"orders[0]": 6})]  # fmt: skip
    events = asyncio.run(events_of(repeated(Store(), Checks(readings), min_interval_s=60)))
    assert [e.payload["at_ms"] for e in events] == [AT, AT + 60_000]


def test_the_trigger_is_built_from_a_feed_and_reads_its_state_from_the_asset_store() -> None:
    rule = {"lag_records": 10, "oldest_unread_age": "5m", "min_interval": "2m", "check_every": "15s"}
    feed = Feed(name="orders", group="g", topics=["orders"], isolation="read_uncommitted", on_missing="latest",
                trigger=rule)  # fmt: skip
    made = LagTrigger.for_feed(feed, "kafka_prod")
    _, kwargs = made.serialize()
    assert kwargs == {
        "feed": "orders", "topics": ["orders"], "group": "g", "isolation": "read_uncommitted",
        "on_missing": "latest", "lag_records": 10, "oldest_unread_age_ms": 300_000, "min_interval_s": 120.0,
        "check_every_s": 15.0, "kafka_conn_id": "kafka_prod", "topic_pattern": None,
    }  # fmt: skip
    assert made.rule.lag_records == 10 and made.rule.oldest_unread_age_ms == 300_000 and made.rule.min_interval_s == 120
    store = Store()
    store.values[STATE_KEY] = {"at_ms": AT, "positions": {"orders[0]": 0}}
    made.asset_state_store = store
    loaded = asyncio.run(made._load_last())
    assert loaded is not None and loaded.at_ms == AT and dict(loaded.positions) == {"orders[0]": 0}


def test_the_probe_is_built_from_the_triggers_kwargs_and_the_kafka_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from tidemark.orchestration import lag_trigger

    seen: list[str] = []

    def connection(conn_id: str) -> Any:
        from tidemark.kafka.connection import KafkaConnection

        seen.append(conn_id)
        return KafkaConnection(bootstrap_servers="127.0.0.1:1")

    monkeypatch.setattr(lag_trigger, "kafka_connection", connection)
    made = LagTrigger(feed="orders", topics=["a", "b"], group="g", isolation="read_uncommitted", on_missing="latest",
                      kafka_conn_id="kafka_prod", topic_pattern={"pattern": r"a.*", "exclude": ["ab"]})  # fmt: skip
    probe = asyncio.run(made._probe())
    try:
        assert seen == ["kafka_prod"]
        assert (probe.topics, probe.group, probe.isolation, probe.on_missing) == (("a", "b"), "g", "read_uncommitted",
                                                                                  "latest")  # fmt: skip
        assert probe.pattern is not None and probe.pattern.pattern == "a.*" and probe.pattern.exclude == ("ab",)
        plain = asyncio.run(LagTrigger(feed="o", topics=["a"], group="g")._probe())
        assert plain.pattern is None and plain.isolation == "read_committed" and plain.on_missing == "earliest"
    finally:
        probe.close()


def test_active_runs_asks_airflow_for_the_feeds_dag_in_queued_or_running(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time import task_runner

    asked: list[tuple[str, list[str]]] = []

    def get_dr_count(*, dag_id: str, states: list[str]) -> int:
        asked.append((dag_id, states))
        return 2

    monkeypatch.setattr(task_runner.RuntimeTaskInstance, "get_dr_count", staticmethod(get_dr_count))
    made = LagTrigger(feed="orders", topics=["a"], group="g")
    assert asyncio.run(made.active_runs()) == 2
    from tidemark.config.models import dag_id

    assert asked == [(dag_id("orders"), ["queued", "running"])]


def test_the_trigger_says_what_it_does_in_the_triggerers_log(caplog: pytest.LogCaptureFixture) -> None:
    """Started (and from where its last firing came), each failed check, each firing, each wait: in the log with the
    feed's name; the event names the feed. Asked once per check at most: a check after a firing whose run has not
    committed waits on the rule alone, without asking Airflow for active runs."""
    import logging

    from tidemark.errors import KafkaUnavailableError

    caplog.set_level(logging.DEBUG, logger="tidemark.orchestration.lag_trigger")
    store = Store()
    fire = LagReading(AT, 50, (), {"orders[0]": 0})
    probe = Checks([KafkaUnavailableError("broker down"), fire, LagReading(AT + 1000, 50, (), {"orders[0]": 0})])
    made = repeated(store, probe)
    made.oldest_unread_age_ms = 600_000
    ages: list[int | None] = []
    reads = probe.read
    probe.read = lambda age=None: (ages.append(age), reads(age))[1]  # type: ignore[method-assign]
    asked: list[int] = []

    async def active() -> int:
        asked.append(1)
        return 0

    made.active_runs = active  # type: ignore[method-assign]
    events = asyncio.run(events_of(made))
    assert [e.payload["feed"] for e in events] == ["orders"]
    assert ages == [600_000, 600_000, 600_000, 600_000]
    assert len(asked) == 1  # the firing check only
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    reason = events[0].payload["reason"]
    assert messages == [
        ("INFO", "lag trigger for feed 'orders' (group g) checks every 0s; last fired: never"),
        ("WARNING", "lag trigger for feed 'orders': check failed, trying again: broker down"),
        ("INFO", f"lag trigger for feed 'orders' fires: {reason}"),
        ("DEBUG", "lag trigger for feed 'orders' waits: fired 1s ago and the group's offsets have not moved since: "
                  "waiting for that run (up to 300s)"),
    ]  # fmt: skip
    caplog.clear()
    asyncio.run(events_of(repeated(store, Checks([]))))
    assert caplog.records[0].getMessage() == (
        "lag trigger for feed 'orders' (group g) checks every 0s; last fired: "
        f"{{'at_ms': {AT}, 'positions': {{'orders[0]': 0}}}} (from Airflow's database)"
    )


def test_the_classpath_airflow_rebuilds_the_trigger_from() -> None:
    classpath, _ = LagTrigger(feed="orders", topics=["a"], group="g").serialize()
    assert classpath == "tidemark.orchestration.lag_trigger.LagTrigger"


def test_a_probe_for_a_feed_takes_its_group_isolation_reset_policy_and_pattern() -> None:
    from tidemark.kafka.connection import KafkaConnection
    from tidemark.orchestration.lag import LagProbe

    feed = Feed(name="orders", group="g", topics={"pattern": r"orders\..*"}, isolation="read_uncommitted",
                on_missing="latest")  # fmt: skip
    probe = LagProbe.for_feed(feed, KafkaConnection(bootstrap_servers="127.0.0.1:1"))
    try:
        assert (probe.group, probe.isolation, probe.on_missing) == ("g", "read_uncommitted", "latest")
        assert probe.pattern == feed.topic_pattern and probe.topics == ()
    finally:
        probe.close()
