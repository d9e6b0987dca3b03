"""What each test cost in CPU, not only in wall time: the suite's budget is two shared cores.

A test's wall time on a loaded machine says little about what it takes from the other
worker; its CPU time does. Around each test this plugin sums the CPU seconds (user + system,
with the waited-for children's) of the test process's whole process tree: the Spark JVM
behind the session, ``spark-submit``\\s, Airflow subprocesses and the servers the fixtures
started. Servers idle between tests add a little to every test; a child that ends without
being waited for is missed. The figure rides on the test's report (``cpu_s``, also in the
JUnit XML as a property), and the summary lists the tests that cost the most.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CPU_PROPERTY = "cpu_s"
_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds incl. waited-for children) of one process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return int(fields[1]), (utime + stime + cutime + cstime) / _TICK


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by ``root`` and every process below it."""
    stats = {int(pid): s for pid in os.listdir("/proc") if pid.isdigit() and (s := _stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo.extend(children.get(pid, []))
    return total


class CpuTimes:
    """The plugin: measures in the process that runs the tests, reports where the summary is written."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.costs: list[tuple[float, str]] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self.started[item.nodeid] = tree_cpu_seconds(os.getpid())
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
        # Before the teardown's report is made: it carries the figure to the controller and the JUnit XML.
        start = self.started.pop(item.nodeid, None) if call.when == "teardown" else None
        if start is not None:
            item.user_properties.append((CPU_PROPERTY, round(tree_cpu_seconds(os.getpid()) - start, 1)))
        yield

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == CPU_PROPERTY and isinstance(value, int | float):
                self.costs.append((float(value), report.nodeid))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.costs:
            return
        total = sum(cost for cost, _ in self.costs)
        terminalreporter.write_sep("=", f"most CPU (process tree, s): {total:.0f} s over {len(self.costs)} tests")
        for cost, nodeid in sorted(self.costs, reverse=True)[:25]:
            terminalreporter.write_line(f"{cost:8.1f}  {nodeid}")
