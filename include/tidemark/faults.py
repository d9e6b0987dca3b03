"""Named fault points: places where the fault suite makes a run crash on purpose.

A fault point does nothing unless ``TIDEMARK_FAULTS`` names it, as ``point`` or
``point:action`` in a comma-separated list. ``raise`` (the default) raises
:class:`InjectedFault`, a ``BaseException`` so that no ``except Exception`` handler
tidies up after it, as after a crash; ``exit`` ends the process at once with exit code
137 (``os._exit``: no ``finally`` block, no flush), as ``kill -9`` would; ``sigint`` sends the
process a real SIGINT (Ctrl-C, an orchestrator's interrupt), which Python raises as
``KeyboardInterrupt`` there, so every handler runs as it would for an operator's interrupt. The points sit
where a crash is most dangerous for the promise "nothing lost, nothing duplicated":
after publishing and before committing, between the Kafka commit and the checkpoint,
between an Iceberg plan's data commit and its dead-letter append; after a run (a re-drive
too) was shown and before the run ledger says so; a re-drive's after it staged; a job after its
records reached staging (raw bytes of bad records there, nothing published); a discard after
it removed the run's files, before its pending record. Reading one environment variable
costs nothing on the normal path.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Literal

FAULTS_ENV = "TIDEMARK_FAULTS"
FaultPoint = Literal[
    "job.after_stage",
    "job.after_publish",
    "iceberg.before_commit",
    "iceberg.before_dead_letters",
    "commit.before",
    "commit.after_kafka",
    "commit.before_show",
    "commit.after_show",
    "redrive.after_stage",
    "discard.before_pending",
    "maintenance.after_rewrite",
    "maintenance.after_compaction",
    "maintenance.after_expiry",
    "maintenance.before_orphans",
    "maintenance.after_orphan",
]


class InjectedFault(BaseException):
    """A crash injected at a named fault point (never raised unless ``TIDEMARK_FAULTS`` asks)."""


def fault_point(name: FaultPoint) -> None:
    """Crash here if ``TIDEMARK_FAULTS`` names this point; see the module docstring."""
    spec = os.environ.get(FAULTS_ENV)
    if not spec:
        return
    for item in spec.split(","):
        point, _, action = item.strip().partition(":")
        if point != name:
            continue
        if action == "exit":
            os._exit(137)
        if action == "sigint":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises here at the latest (a thread may have taken the signal)
            return
        raise InjectedFault(f"injected fault at {name}")
