"""The Tidemark view behind Airflow's own auth, on a real Airflow api-server.

The test starts ``airflow api-server`` with its own home, SQLite metadata database,
SimpleAuthManager users (an admin and a viewer), and the project's plugin and DAG
folders, then asks for the plugin's pages anonymously (401), with each user's token as a
Bearer header and as the UI's ``_token`` cookie (200).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _request(url: str, *, token: str | None = None, cookie: str | None = None,
             body: dict[str, Any] | None = None) -> tuple[int, str]:  # fmt: skip
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if cookie:
        headers["Cookie"] = f"_token={cookie}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


@pytest.fixture(scope="module")
def api_server(kafka: KafkaTestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("airflow-api")
    port = _free_port()
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__API_AUTH__JWT_SECRET": "tidemark-test-secret-not-for-production",
        "AIRFLOW_CONN_TIDEMARK_KAFKA": json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka.bootstrap_servers}}
        ),
        "GX_ANALYTICS_ENABLED": "False",
        "TIDEMARK_STATE_DIR": str(home / "state"),
    }
    env.pop("TIDEMARK_BOOTSTRAP_SERVERS", None)
    airflow = str(Path(sys.executable).with_name("airflow"))
    migrate = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True, check=False)
    assert migrate.returncode == 0, migrate.stderr[-2000:]
    log = (home / "api-server.log").open("w")
    proc = subprocess.Popen(
        [airflow, "api-server", "--port", str(port), "--host", "127.0.0.1"], env=env, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (home / "api-server.log").read_text()[-3000:]
            try:
                if _request(f"{base}/api/v2/monitor/health")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (home / "api-server.log").read_text()[-3000:]
            time.sleep(1)
        passwords = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())
        tokens = {}
        for user in ("admin", "viewer"):
            status, text = _request(f"{base}/auth/token", body={"username": user, "password": passwords[user]})
            assert status in (200, 201), text
            tokens[user] = json.loads(text)["access_token"]
        yield {"base": base, "tokens": tokens}
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


@pytest.mark.parametrize("path", ["/tidemark/", "/tidemark/feeds/demo", "/tidemark/api/feeds/demo"])
def test_anonymous_requests_are_refused(api_server: dict[str, Any], path: str) -> None:
    status, _ = _request(api_server["base"] + path)
    assert status == 401


def test_logged_in_users_read_the_view(api_server: dict[str, Any]) -> None:
    base, tokens = api_server["base"], api_server["tokens"]
    for user in ("admin", "viewer"):
        status, text = _request(f"{base}/tidemark/", token=tokens[user])
        assert status == 200, (user, text[:500])
        assert "Tidemark feeds" in text and "demo" in text
        status, text = _request(f"{base}/tidemark/api/feeds/demo", cookie=tokens[user])  # the UI's cookie
        assert status == 200, (user, text[:500])
        assert "partitions" in json.loads(text)["status"] or "error" in json.loads(text)["status"]
    status, _ = _request(f"{base}/tidemark/", token="not-a-token")
    assert status in (401, 403)  # Airflow answers a forged token with 403
