"""The embedded cluster's generated configuration (no JVM started)."""

from __future__ import annotations

from pathlib import Path

from tidemark.devtools.kafka.cluster import ClusterState, LocalCluster, Node, kafka_version


def _state(tmp_path: Path, n: int) -> ClusterState:
    nodes = tuple(Node(i, 9000 + i, 9100 + i, str(tmp_path / f"node-{i}")) for i in range(1, n + 1))
    return ClusterState(str(tmp_path), "cid", kafka_version(), nodes, {"offsets.retention.minutes": "1"})


def test_server_properties_for_three_combined_nodes(tmp_path: Path) -> None:
    state = _state(tmp_path, 3)
    props = dict(
        line.split("=", 1) for line in LocalCluster(tmp_path)._server_properties(state, state.nodes[1]).splitlines()
    )
    assert props["node.id"] == "2"
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["offsets.retention.minutes"] == "1"  # caller settings win
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_state_roundtrip_and_bootstrap(tmp_path: Path) -> None:
    state = _state(tmp_path, 2)
    again = ClusterState.from_json(state.to_json())
    assert again == state
    assert again.bootstrap_servers == "127.0.0.1:9001,127.0.0.1:9002"


def test_kafka_version_is_4x() -> None:
    assert kafka_version().startswith("4.")


def test_format_accepts_a_cluster_id_that_starts_with_a_dash(tmp_path: Path) -> None:
    """Kafka's argparse took '-abc...' for an option when passed as a separate argument."""
    import subprocess

    from tidemark.devtools.kafka.cluster import LocalCluster, fetch_jars

    cluster = LocalCluster(tmp_path)
    state = _state(tmp_path, 1)
    state = ClusterState(state.home, "-AbCdEfGhIjKlMnOpQrStUv", state.kafka_version, state.nodes, {})
    node = state.nodes[0]
    (node.path / "data").mkdir(parents=True)
    (node.path / "logs").mkdir(parents=True)
    node.config_file.write_text(cluster._server_properties(state, node))
    cmd = cluster._format_command(fetch_jars(), state, node)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=node.path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (node.path / "data" / "meta.properties").exists()


def test_a_node_just_launched_is_not_taken_for_an_exited_one(tmp_path: Path) -> None:
    """Right after Popen a child's /proc/<pid>/cmdline can read empty: that is "starting", not "gone"."""
    import subprocess
    import sys
    import time

    from tidemark.devtools.kafka.cluster import _pid_runs

    config = tmp_path / "server.properties"
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)", str(config)]
    for _ in range(20):  # checked at once, as wait_ready does: never "exited" while it runs
        proc = subprocess.Popen(sleeper)
        try:
            assert _pid_runs(proc.pid, config)
            time.sleep(0.05)
            assert _pid_runs(proc.pid, config)
            assert not _pid_runs(proc.pid, tmp_path / "another-node.properties")  # a different process
        finally:
            proc.kill()
        deadline = time.monotonic() + 10
        while _pid_runs(proc.pid, config):  # killed, not yet reaped: a zombie counts as gone
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.wait()
        assert not _pid_runs(proc.pid, config)
    assert not _pid_runs(None, config)
