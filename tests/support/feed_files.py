"""What the feed-file tests check of a refusal: the file first, then every name the message must give."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tidemark.config.models import load_feed_file
from tidemark.errors import ConfigError


def assert_refused_naming(path: Path, names: Sequence[str]) -> None:
    """Loading ``path`` raises a :class:`ConfigError` whose message starts with the file and holds each of ``names``."""
    with pytest.raises(ConfigError) as err:
        load_feed_file(path)
    message = str(err.value)
    assert message.startswith(str(path))
    for name in names:
        assert name in message, (name, message)
