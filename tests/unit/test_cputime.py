"""The suite's CPU figures count a test's children, and only its own process tree (tests.support.cputime)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.support.cputime import tree_cpu_seconds

# The child burns more than the 0.6 s the tests wait for: /proc counts whole clock ticks, and a child that
# stopped at exactly 0.6 s of its own clock could show 0.59 there for ever.
BURN = "import time\nend = time.process_time() + 0.8\nwhile time.process_time() < end: pass\n"


def burnt(pid: int) -> bool:
    """Whether ``pid``'s tree has used 0.6 CPU-s, waiting for it up to 30 s."""
    deadline = time.monotonic() + 30
    while tree_cpu_seconds(pid) < 0.6:
        if time.monotonic() > deadline:
            return False
    return True


def test_a_child_that_burns_cpu_counts_for_its_parent_while_it_runs_and_once_waited_for() -> None:
    before = tree_cpu_seconds(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", BURN + "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert burnt(child.pid)  # running: counted as a process of the tree
        assert tree_cpu_seconds(os.getpid()) - before >= 0.6
    finally:
        child.communicate(b"")  # it ends and is waited for: its time moves to this process's children's
    assert tree_cpu_seconds(os.getpid()) - before >= 0.6


def test_a_process_outside_the_tree_is_not_counted() -> None:
    other = subprocess.Popen([sys.executable, "-c", BURN + "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert burnt(other.pid)
        # The burning child is below this process and beside the child's own tree: a tree rooted in
        # a sibling (this test's own fresh child, idle) does not pick it up.
        idle = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        try:
            assert tree_cpu_seconds(idle.pid) < 0.5
        finally:
            idle.communicate(b"")
    finally:
        other.communicate(b"")
