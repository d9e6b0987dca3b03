"""The lag trigger: Airflow's event-driven scheduling of a feed when data arrives, in the triggerer.

A feed with ``trigger:`` gets an Asset of its own, ``tidemark_lag_<feed>``, watched by a
:class:`LagTrigger` (an ``AssetWatcher``); the feed's DAG is scheduled on that Asset (and its
cron, if it has one). The trigger runs in Airflow's triggerer, an asyncio loop: it holds no
worker slot, and every ``check_every`` it reads the group's lag with offset look-ups only
(:class:`tidemark.orchestration.lag.LagProbe`, run in a thread so the loop never blocks) and
applies :func:`tidemark.orchestration.lag.decide`. When the rule fires it records the firing in
the Asset's state (Airflow's database) and yields an event whose payload says why (the lag, the
overdue partitions); Airflow stores it as an asset event (extra ``payload``) and the scheduler
creates the DAG run, whose plan task records the reason in the run (``trigger.json``).

How Airflow runs it, and the design that follows (read from Airflow 3.3's triggerer): a watcher's
trigger is a row in Airflow's database tied to the Asset; a triggerer runs it as long as the row
exists and may yield any number of events. If its generator ends, or the triggerer restarts, the
next triggerer loop builds a new instance from the row's kwargs: nothing in memory survives. So
the kwargs carry only plain values (the feed's topics, group and thresholds, and the *id* of the
Kafka connection, resolved inside :meth:`LagTrigger.run`: no secret is ever serialized), and what
must survive (the last firing: its time and the group's committed offsets then) lives in the
Asset's state, read when the trigger starts. Never two runs at once: the DAG has
``max_active_runs=1``, the rule asks Airflow how many runs are queued or running before firing,
and after a firing it waits until the committed offsets move (or the grace passes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from asgiref.sync import sync_to_async

from tidemark.config.models import Feed, TopicPattern, dag_id
from tidemark.errors import TidemarkError
from tidemark.orchestration.connections import kafka_connection
from tidemark.orchestration.lag import Decision, Fired, LagProbe, LagReading, Thresholds, decide

log = logging.getLogger(__name__)

STATE_KEY = "tidemark_lag_trigger"
ACTIVE_STATES = ["queued", "running"]


class LagTrigger(BaseEventTrigger):  # type: ignore[misc]
    """Fires when a feed's consumer group is ``lag_records`` behind or has an unread record older than an age.

    Example (what :func:`lag_asset` builds from a feed file)::

        LagTrigger(feed="orders", topics=["orders"], group="tidemark-orders", lag_records=10000)
    """

    def __init__(
        self,
        *,
        feed: str,
        topics: list[str],
        group: str,
        isolation: str = "read_committed",
        on_missing: str = "earliest",
        lag_records: int | None = None,
        oldest_unread_age_ms: int | None = None,
        min_interval_s: float = 60.0,
        check_every_s: float = 30.0,
        kafka_conn_id: str = "tidemark_kafka",
        topic_pattern: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.feed = feed
        self.topics = list(topics)
        self.topic_pattern = topic_pattern  # a pattern feed's {pattern, exclude}: its topics are listed each refresh
        self.group = group
        self.isolation = isolation
        self.on_missing = on_missing
        self.lag_records = lag_records
        self.oldest_unread_age_ms = oldest_unread_age_ms
        self.min_interval_s = float(min_interval_s)
        self.check_every_s = float(check_every_s)
        self.kafka_conn_id = kafka_conn_id
        self._last: Fired | None = None

    @classmethod
    def for_feed(cls, feed: Feed, kafka_conn_id: str) -> LagTrigger:
        rule = Thresholds.of(feed)
        assert feed.trigger is not None  # Thresholds.of refused otherwise
        return cls(
            feed=feed.name, topics=list(feed.topics), group=feed.group, isolation=feed.isolation,
            on_missing=feed.on_missing, lag_records=rule.lag_records, oldest_unread_age_ms=rule.oldest_unread_age_ms,
            min_interval_s=rule.min_interval_s, check_every_s=feed.trigger.check_every_s, kafka_conn_id=kafka_conn_id,
            topic_pattern=None if feed.topic_pattern is None else feed.topic_pattern.model_dump(mode="json"),
        )  # fmt: skip

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "feed": self.feed, "topics": self.topics, "group": self.group, "isolation": self.isolation,
                "on_missing": self.on_missing, "lag_records": self.lag_records,
                "oldest_unread_age_ms": self.oldest_unread_age_ms, "min_interval_s": self.min_interval_s,
                "check_every_s": self.check_every_s, "kafka_conn_id": self.kafka_conn_id,
                "topic_pattern": self.topic_pattern,
            },
        )  # fmt: skip

    @property
    def rule(self) -> Thresholds:
        return Thresholds(self.lag_records, self.oldest_unread_age_ms, self.min_interval_s)

    # -- state in Airflow's database (the watched Asset's state store) ------------------------

    def _store(self) -> Any:
        return getattr(self, "asset_state_store", None)

    async def _load_last(self) -> Fired | None:
        store = self._store()
        if store is None:  # not run by a triggerer for an Asset (a unit test): memory only
            return self._last
        return Fired.from_json(await store.aget(STATE_KEY))

    async def _save_last(self, fired: Fired) -> None:
        self._last = fired
        store = self._store()
        if store is not None:
            await store.aset(STATE_KEY, fired.to_json())

    async def active_runs(self) -> int:
        """Runs of the feed's DAG queued or running, asked of Airflow (its API, through the triggerer)."""
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        count = await sync_to_async(RuntimeTaskInstance.get_dr_count)(dag_id=dag_id(self.feed), states=ACTIVE_STATES)
        return int(count)

    # -- the loop -------------------------------------------------------------------------------

    async def _probe(self) -> LagProbe:
        connection = await sync_to_async(kafka_connection)(self.kafka_conn_id)
        pattern = None if self.topic_pattern is None else TopicPattern(**self.topic_pattern)
        return LagProbe(connection, self.topics, self.group, self.isolation, self.on_missing, pattern)  # type: ignore[arg-type]

    async def check(self, probe: LagProbe) -> tuple[Decision, LagReading]:
        """One check: read the lag in a thread, then apply the rule (asking for active runs only if it would fire)."""
        reading = await asyncio.to_thread(probe.read, self.oldest_unread_age_ms)
        decision = decide(self.rule, reading, self._last, active_runs=0)
        if decision.fire:
            decision = decide(self.rule, reading, self._last, active_runs=await self.active_runs())
        return decision, reading

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self._last = await self._load_last()
        probe = await self._probe()
        log.info(
            "lag trigger for feed '%s' (group %s) checks every %.0fs; last fired: %s", self.feed, self.group,
            self.check_every_s, "never" if self._last is None else f"{self._last.to_json()} (from Airflow's database)",
        )  # fmt: skip
        try:
            while True:
                try:
                    decision, reading = await self.check(probe)
                except TidemarkError as exc:
                    # A broker down or a missing ACL: said in the triggerer's log, checked again next time. The
                    # trigger must not end: an ended watcher is only rebuilt by the next triggerer loop.
                    log.warning("lag trigger for feed '%s': check failed, trying again: %s", self.feed, exc)
                else:
                    if decision.fire:
                        await self._save_last(Fired(reading.at_ms, reading.positions))
                        log.info("lag trigger for feed '%s' fires: %s", self.feed, decision.reason)
                        yield TriggerEvent({"feed": self.feed, "reason": decision.reason, **reading.to_json()})
                    else:
                        log.debug("lag trigger for feed '%s' waits: %s", self.feed, decision.reason)
                await asyncio.sleep(self.check_every_s)
        finally:
            await asyncio.to_thread(probe.close)
