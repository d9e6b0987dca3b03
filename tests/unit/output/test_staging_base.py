"""The local staging base: a folder of the user's own, mode 0700, in a shared temp dir (masked feeds' raw bytes are
staged there before masking drops them)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tidemark.errors import StateStoreError
from tidemark.output.staging import local_staging_base, private_dir
from tidemark.storage import Location


def test_the_default_staging_base_is_the_users_own_folder_closed_to_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIDEMARK_STAGING_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    base = local_staging_base(Location.of(str(tmp_path / "out")))
    own = tmp_path / f"tidemark-staging-{os.getuid()}"
    assert base.parent == own and stat.S_IMODE(own.stat().st_mode) == 0o700
    assert local_staging_base(Location.of(str(tmp_path / "out"))) == base  # the same folder next time


def test_a_staging_folder_someone_else_made_or_opened_is_refused(tmp_path: Path) -> None:
    opened = tmp_path / "opened"
    opened.mkdir(mode=0o755)
    opened.chmod(0o755)
    with pytest.raises(StateStoreError, match=r"open to other users \(mode 755\).*chmod 700"):
        private_dir(opened)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    assert private_dir(closed) == closed  # mode 700, the user's own: taken
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(StateStoreError, match="not a folder of this user"):
        private_dir(link)
    if os.getuid() == 0:  # only root can hand a folder to another user here
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        with pytest.raises(StateStoreError, match="someone else made it"):
            private_dir(foreign)
