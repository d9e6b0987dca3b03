"""``make debezium``: PostgreSQL with logical replication, Kafka Connect and Debezium's connector on a demo table.

Starts a throwaway PostgreSQL (:mod:`tests.support.servers.postgres`, ``wal_level=logical``)
with a table ``customers`` and a few rows, creates the connector's topic with three partitions
on the cluster (``TIDEMARK_BOOTSTRAP_SERVERS``, else the one ``tidemark kafka up`` started),
starts a standalone Kafka Connect worker (:mod:`tidemark.devtools.connect`) and the connector,
then prints the topic, a keyed feed for it and the source's URL, and waits: changes made with
``psql`` on that URL reach the topic. Ctrl-C stops the worker and the server (both purged).
"""

from __future__ import annotations

import argparse
import signal
import time
from collections.abc import Sequence
from typing import Any

from tests.support.servers import postgres as pg_local
from tidemark.devtools import connect
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.kafka.admin import KafkaAdmin

FEED = """topics: [{topic}]
group: tidemark-{prefix}-customers
deserialization:
  format: json
  schema_ddl: >-
    before struct<id: int, name: string, email: string>, after struct<id: int, name: string, email: string>,
    op string, source struct<ts_ms: long, lsn: long, sequence: string>, ts_ms long
output_format: iceberg
iceberg:
  table: lake.customers
  mode: upsert
  key: [id]
  change_format: debezium
"""


def seed(server: pg_local.LocalPostgres) -> None:
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email text)")
        conn.execute("INSERT INTO customers SELECT i, 'customer ' || i, 'c' || i || '@example.com' "
                     "FROM generate_series(1, 5) AS i")  # fmt: skip


def up(prefix: str) -> tuple[pg_local.LocalPostgres, connect.LocalConnect, str]:
    """Start everything; returns the server, the worker and the topic."""
    kafka = connection_from_env()
    server = pg_local.start(settings=pg_local.LOGICAL_REPLICATION)
    try:
        seed(server)
        topic = f"{prefix}.public.customers"
        KafkaAdmin(kafka).create_topic(topic, 3)
        worker = connect.start(kafka.bootstrap_servers)
    except BaseException:
        server.stop()
        raise
    try:
        config = connect.debezium_postgres(
            host="127.0.0.1", port=server.port, user=pg_local.DB_USER, password=server.password,
            database=pg_local.DB_NAME, topic_prefix=prefix, tables=["public.customers"], slot=prefix,
        )  # fmt: skip
        worker.put_connector(prefix, config)
    except BaseException:
        worker.stop()
        server.stop()
        raise
    return server, worker, topic


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--prefix", default="dbserver1", help="the connector's topic prefix (and slot name)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    server, worker, topic = up(args.prefix)
    print(f"PostgreSQL and Kafka Connect with Debezium up in {time.monotonic() - started:.0f} s")
    print(f"source (psql):  {server.url}\nConnect REST:   {worker.url} (log {worker.log_file})")
    print(f"topic:          {topic}")
    print(f"a keyed feed for it (feeds/customers_cdc.yaml):\n\n{FEED.format(topic=topic, prefix=args.prefix)}")
    print("Ctrl-C stops the worker and the server.")

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        worker.stop()
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
