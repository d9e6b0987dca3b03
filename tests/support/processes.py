"""Which running processes hold a value in their command line or environment (Linux ``/proc``).

The process list and a process's environment are where a secret handed to ``spark-submit`` as an
argument or a variable shows (and, on Kubernetes, the driver pod's spec). Tests watch both while a
run goes on: :func:`watch_processes` polls every process of this user but one (the test's own
child, whose environment the test set) until the block ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def holding(needles: Sequence[bytes], skip: set[int]) -> dict[str, set[str]]:
    """Now: each needle found, with where (``the environ of <command line>``)."""
    found: dict[str, set[str]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        if int(proc.name) in skip:
            continue
        try:
            parts = {part: (proc / part).read_bytes() for part in ("cmdline", "environ")}
        except OSError:  # gone, or another user's
            continue
        command = parts["cmdline"].replace(b"\0", b" ")[:100].decode(errors="replace")
        for part, data in parts.items():
            for needle in needles:
                if needle in data:
                    found.setdefault(needle.decode(errors="replace"), set()).add(f"the {part} of {command}")
    return found


@contextmanager
def watch_processes(needles: Sequence[bytes], skip: set[int], every_s: float = 0.1) -> Iterator[dict[str, set[str]]]:
    """Poll :func:`holding` until the block ends; the dict it yields fills with what was found."""
    found: dict[str, set[str]] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(every_s):
            for needle, where in holding(needles, skip).items():
                found.setdefault(needle, set()).update(where)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        yield found
    finally:
        stop.set()
        watcher.join()
