"""Runtime code reads the cluster it is given; only the dev tools fall back to the embedded cluster."""

from __future__ import annotations

import pytest

from tests.conftest import KafkaTestCluster
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.errors import ConfigError
from tidemark.kafka.connection import from_env

pytestmark = pytest.mark.integration


def test_runtime_never_reaches_for_a_running_local_cluster(
    kafka: KafkaTestCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = kafka.require_local()
    monkeypatch.setenv("TIDEMARK_KAFKA_HOME", str(cluster.home))  # the embedded cluster's default home
    monkeypatch.delenv("TIDEMARK_BOOTSTRAP_SERVERS", raising=False)

    with pytest.raises(ConfigError, match="TIDEMARK_BOOTSTRAP_SERVERS"):
        from_env({})
    # The CLI, the demo and the benchmarks ask for the fallback by name.
    assert connection_from_env({}).bootstrap_servers == kafka.bootstrap_servers
    assert connection_from_env({"TIDEMARK_BOOTSTRAP_SERVERS": "elsewhere:9092"}).bootstrap_servers == "elsewhere:9092"
