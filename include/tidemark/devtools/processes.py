"""Stopping the local servers' JVMs by pid: a polite SIGTERM, then SIGKILL after a grace period.

Shared by the local stand-ins that run one process each (the schema registry, and the test
suite's s3proxy); the Kafka cluster checks each pid's command line first (see its ``down``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (reaping it first when it is our exited child)."""
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: ask the kernel
        return Path(f"/proc/{pid}").exists()
    return waited == 0


def stop_pid(pid: int, grace_s: float = 30.0) -> None:
    """SIGTERM ``pid``, wait up to ``grace_s`` for it to exit, then SIGKILL it."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
