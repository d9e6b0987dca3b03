"""fetch_once: one process fills the cache while the others wait, and a failed fetch leaves nothing behind."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from tidemark.devtools.maven import fetch_once
from tidemark.errors import LocalServerError


def _fill_slowly(partial: Path) -> None:
    # Each filling process leaves its pid in a log beside the cache; a second filler would also find
    # the first one's files in its partial folder if partial folders were shared.
    with (partial.parent / "fills.log").open("a") as log:
        log.write(f"{partial.name}\n")
    assert not any(partial.iterdir()), "the partial folder must start empty"
    (partial / "lib.jar").write_text("jar")
    time.sleep(0.5)
    (partial / ".complete").touch()


def _fetch(target: str) -> None:
    fetch_once(Path(target), _fill_slowly)


def test_processes_asking_at_once_fetch_once_and_all_find_the_whole_folder(tmp_path: Path) -> None:
    target = tmp_path / "kafka" / "lib"
    target.parent.mkdir()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_fetch, args=(str(target),)) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    assert len((target.parent / "fills.log").read_text().splitlines()) == 1
    assert sorted(p.name for p in target.iterdir()) == [".complete", "lib.jar"]
    assert [p.name for p in target.parent.iterdir() if ".partial" in p.name] == []


def test_a_failed_fetch_leaves_no_folder_and_the_next_call_fetches_again(tmp_path: Path) -> None:
    target = tmp_path / "registry"

    def broken(partial: Path) -> None:
        (partial / "half.tar.gz").write_text("half")
        raise LocalServerError("Maven could not fetch the registry (exit 1)")

    with pytest.raises(LocalServerError, match="could not fetch"):
        fetch_once(target, broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["registry.lock"]
    assert fetch_once(target, _fill_slowly) == target
    assert (target / "lib.jar").read_text() == "jar"
