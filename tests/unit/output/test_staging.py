"""The staging folders' ownership: named by their run, proven live by a lock the kernel drops with the process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def test_a_staging_lock_outlives_no_process(tmp_path: Path) -> None:
    """The proof a settle relies on: a folder whose staging process was SIGKILLed is dead, one this process holds
    is live, and a run id that is a prefix of another's names only its own folders."""
    from tidemark.output.staging import make_root, release, remove_run_staging

    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from tidemark.output.staging import make_root\n"
        "make_root(Path(sys.argv[1]), 'r1.dead')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False, env=os.environ.copy())
    assert proc.returncode == -signal.SIGKILL
    live = make_root(tmp_path, "r1.live")
    other = make_root(tmp_path, "r10.live")
    remove_run_staging(tmp_path, None, "r1", dead_only=True)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["r1.live", "r10.live"]
    remove_run_staging(tmp_path, None, "r1")  # the run is done with: every folder of its own goes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r10.live", "r10.live.lock"]
    assert not live.exists()
    release(other)
