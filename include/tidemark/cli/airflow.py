"""``tidemark airflow up|down``: Airflow with Tidemark's DAGs, plugin and connections, on this machine.

``up`` starts (or reuses) the embedded Kafka cluster, makes sure the demo feed's topic
has some events, starts Airflow (:class:`tidemark.devtools.airflow.LocalAirflow`), prints
the URL and the logins, and stays in the foreground: Ctrl-C stops Airflow. ``down``
stops an Airflow started by ``up`` from another shell (``make airflow-down``). The
Kafka cluster keeps running either way (``tidemark kafka down`` stops it).
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

from tidemark.cli.demo import BAD_EVERY, DEMO_PARTITIONS, DEMO_TOPIC, demo_events
from tidemark.devtools.airflow import LocalAirflow
from tidemark.devtools.kafka.cluster import LocalCluster
from tidemark.kafka.admin import KafkaAdmin, produce
from tidemark.kafka.connection import KafkaConnection


def _seed_demo_topic(bootstrap_servers: str) -> None:
    """The demo feed reads ``tidemark.demo.events``: create it and give it events if it has none."""
    conn = KafkaConnection(bootstrap_servers)
    adapter = KafkaAdmin(conn)
    adapter.create_topic(DEMO_TOPIC, DEMO_PARTITIONS, replication=1)
    tps = [(p.topic, p.partition) for p in adapter.partitions([DEMO_TOPIC])]
    if sum(adapter.end_offsets(tps, "read_uncommitted").values()) == 0:
        sent = produce(conn, DEMO_TOPIC, demo_events(600, bad_every=BAD_EVERY))
        print(f"produced {sent} demo events into {DEMO_TOPIC}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _up(args: argparse.Namespace) -> int:
    state = LocalCluster().up()
    print(f"Kafka: {len(state.nodes)} brokers, bootstrap.servers={state.bootstrap_servers}")
    _seed_demo_topic(state.bootstrap_servers)
    airflow = LocalAirflow(home=Path(args.home) if args.home else LocalAirflow().home, port=args.port,
                           bootstrap_servers=state.bootstrap_servers)  # fmt: skip
    print(f"starting Airflow (api-server, scheduler, dag-processor) from {airflow.home} ...", flush=True)
    airflow.up()
    passwords = airflow.passwords()
    print(f"\nAirflow is up: {airflow.url}")
    print(f"Tidemark view: {airflow.url}/plugin/tidemark  (Browse → Tidemark offsets)")
    where = airflow.home / "simple_auth_manager_passwords.json.generated"
    for user in ("admin", "viewer"):
        # Shown to the person who started Airflow (as `airflow standalone` does); never logged elsewhere.
        print(f"login: {user} / {passwords.get(user, f'(see {where})')}")
    print(f"logs: {airflow.home / 'logs'}\nCtrl-C (or 'make airflow-down' elsewhere) stops Airflow.", flush=True)
    # Ctrl-C and a plain `kill` both stop Airflow cleanly (SIGINT set explicitly: a shell may
    # start background jobs with it ignored).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while airflow.running():
            time.sleep(2)
        if not airflow.pids_file.exists():  # `tidemark airflow down` stopped it: a clean stop
            print("Airflow was stopped")
            return 0
        print(f"Airflow's processes exited; see {airflow.home / 'logs'}")
        return 1
    except KeyboardInterrupt:
        print("\nstopping Airflow ...")
        return 0
    finally:
        airflow.down()


def _down(args: argparse.Namespace) -> int:
    airflow = LocalAirflow(home=Path(args.home)) if args.home else LocalAirflow()
    stopped = airflow.down()
    print(f"stopped {', '.join(stopped)}" if stopped else f"no Airflow running from {airflow.home}")
    return 0


def add_airflow(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    airflow = sub.add_parser("airflow", help="a local Airflow with Tidemark's DAGs, view and connections")
    asub = airflow.add_subparsers(dest="airflow_cmd", required=True)
    up = asub.add_parser("up", help="start Kafka and Airflow, print the URL and logins; Ctrl-C stops Airflow")
    up.add_argument("--port", type=int, default=8080)
    up.add_argument("--home", help="AIRFLOW_HOME (default ~/.cache/tidemark/airflow or TIDEMARK_AIRFLOW_HOME)")
    up.set_defaults(func=_up)
    down = asub.add_parser("down", help="stop the Airflow that 'up' started")
    down.add_argument("--home")
    down.set_defaults(func=_down)
