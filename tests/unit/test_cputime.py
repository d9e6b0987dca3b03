"""The suite's CPU figures count a test's children, and only its own process tree (tests.support.cputime)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.cputime import tree_cpu_seconds

BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"


def test_a_child_that_burns_cpu_counts_for_its_parent_while_it_runs_and_once_waited_for() -> None:
    before = tree_cpu_seconds(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", BURN + "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        while tree_cpu_seconds(child.pid) < 0.6:  # running: counted as a process of the tree
            pass
        assert tree_cpu_seconds(os.getpid()) - before >= 0.6
    finally:
        child.communicate(b"")  # it ends and is waited for: its time moves to this process's children's
    assert tree_cpu_seconds(os.getpid()) - before >= 0.6


def test_a_process_outside_the_tree_is_not_counted() -> None:
    other = subprocess.Popen([sys.executable, "-c", BURN + "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        while tree_cpu_seconds(other.pid) < 0.6:
            pass
        # The burning child is below this process and beside the child's own tree: a tree rooted in
        # a sibling (this test's own fresh child, idle) does not pick it up.
        idle = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        try:
            assert tree_cpu_seconds(idle.pid) < 0.5
        finally:
            idle.communicate(b"")
    finally:
        other.communicate(b"")
