"""librdkafka's own log lines go through Python logging, and the CLI prints them only when asked.

Real librdkafka against a port where nothing listens: every connection attempt is refused
and logged (``FAIL ... Connection refused``), no broker needed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
from tidemark.cli import show_client_log
from tidemark.errors import TidemarkError
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection

show_client_log(sys.argv[1] if len(sys.argv) > 1 else None)
try:
    KafkaAdapter(KafkaConnection("127.0.0.1:1"), timeout_s=2).partitions(["orders"])
except TidemarkError as exc:
    print(f"tidemark: error: {exc}", file=sys.stderr)
"""


def _stderr(*level: str) -> str:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *level], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def test_the_cli_hides_librdkafka_lines_by_default() -> None:
    err = _stderr()
    assert "tidemark: error: describing topic 'orders' on 127.0.0.1:1" in err  # Tidemark's own message stays
    assert "Connection refused" not in err and "%3|" not in err, err


@pytest.mark.parametrize("level", ["error", "debug"])
def test_the_cli_prints_librdkafka_lines_when_asked(level: str) -> None:
    err = _stderr(level)
    assert "kafka client ERROR: FAIL [rdkafka#" in err and "Connection refused" in err, err
    assert "%3|" not in err  # through Python logging, never librdkafka's raw stderr lines
