"""The ``tidemark`` command line.

Subcommands are registered by small ``add_*`` functions, each with a handler that calls
the library and prints through :mod:`tidemark.cli.output` (the leaf every command module
imports; no command module imports this one). Errors Tidemark raises on purpose (:class:`TidemarkError`) print
as one clear message and exit 2; anything else is a bug and keeps its traceback.
Connection settings come from the environment (see :mod:`tidemark.kafka.connection`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from tidemark.cli.airflow import add_airflow
from tidemark.cli.deadletters import add_deadletters
from tidemark.cli.demo import run_demo
from tidemark.cli.maintain import add_maintain
from tidemark.cli.output import error, table
from tidemark.cli.plan import add_planning
from tidemark.cli.run import add_run
from tidemark.cli.runs import add_runs
from tidemark.cli.verify import add_verify
from tidemark.cli.watch import add_watch
from tidemark.devtools.kafka.cluster import LocalCluster, fetch_jars
from tidemark.errors import TidemarkError
from tidemark.kafka.connection import CLIENT_LOG

Handler = Callable[[argparse.Namespace], int]


# -- kafka -------------------------------------------------------------------------


def _kafka_up(args: argparse.Namespace) -> int:
    cluster = LocalCluster()
    already = {n.node_id for n in cluster.running_nodes()}
    state = cluster.up(brokers=args.brokers)
    if already and already == {n.node_id for n in state.nodes}:
        print(f"already running: {len(state.nodes)} brokers (Kafka {state.kafka_version}) at {cluster.home}")
    else:
        print(f"started {len(state.nodes)} brokers (Kafka {state.kafka_version}) at {cluster.home}")
    print(f"bootstrap.servers={state.bootstrap_servers}")
    return 0


def _kafka_down(args: argparse.Namespace) -> int:
    stopped = LocalCluster().down(purge=args.purge)
    print(f"stopped nodes {stopped}" if stopped else "no running nodes")
    return 0


def _kafka_status(args: argparse.Namespace) -> int:
    cluster = LocalCluster()
    state = cluster.state()
    if state is None:
        print(f"no local cluster at {cluster.home} (start one with 'tidemark kafka up')")
        return 1
    rows = [(n.node_id, n.address, n.controller_port, n.pid, "up" if up else "down") for n, up in cluster.status()]
    print(table(["node", "broker", "controller port", "pid", "state"], rows))
    print(f"bootstrap.servers={state.bootstrap_servers}")
    return 0 if all(up for _, up in cluster.status()) else 1


def _kafka_fetch(args: argparse.Namespace) -> int:
    print(fetch_jars(quiet=not args.verbose))
    return 0


def add_kafka(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kafka = sub.add_parser("kafka", help="the embedded local Kafka cluster")
    ksub = kafka.add_subparsers(dest="kafka_cmd", required=True)
    up = ksub.add_parser("up", help="start (or reuse) the local cluster and print bootstrap.servers")
    up.add_argument("--brokers", type=int, default=3)
    up.set_defaults(func=_kafka_up)
    down = ksub.add_parser("down", help="stop the brokers this cluster started")
    down.add_argument("--purge", action="store_true", help="also delete the cluster's data and ports")
    down.set_defaults(func=_kafka_down)
    ksub.add_parser("status", help="show the local cluster's nodes").set_defaults(func=_kafka_status)
    fetch = ksub.add_parser("fetch", help="download the Kafka jars with Maven (done by 'up' when needed)")
    fetch.add_argument("--verbose", action="store_true")
    fetch.set_defaults(func=_kafka_fetch)


# -- demo --------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    return int(run_demo(records=args.records))


def add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="run Tidemark end to end on the embedded local cluster")
    demo.add_argument("--records", type=int, default=600, help="demo events produced per round")
    demo.set_defaults(func=_demo)


REGISTRARS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    add_kafka,
    add_demo,
    add_planning,
    add_run,
    add_runs,
    add_deadletters,
    add_maintain,
    add_verify,
    add_airflow,
    add_watch,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidemark", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--kafka-log",
        choices=("error", "warning", "info", "debug"),
        help="print librdkafka's own log lines at this level and above (hidden by default: "
        "Tidemark's errors already say what failed)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for register in REGISTRARS:
        register(sub)
    return parser


def show_client_log(level: str | None) -> None:
    """Print librdkafka's lines at ``level`` and above to stderr; none when ``level`` is None."""
    CLIENT_LOG.propagate = False
    if level is None:
        CLIENT_LOG.setLevel(logging.CRITICAL + 1)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kafka client %(levelname)s: %(message)s"))
    CLIENT_LOG.addHandler(handler)
    CLIENT_LOG.setLevel(level.upper())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    show_client_log(args.kafka_log)
    handler: Handler = args.func
    try:
        return int(handler(args))
    except TidemarkError as exc:
        error(exc)
        return 2
    except KeyboardInterrupt:
        return 130
