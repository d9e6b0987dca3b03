"""How connection settings and secrets reach the Spark driver: through a private file, never a command line.

``spark-submit`` hands its environment on differently per master: the Spark provider turns a
task's ``env_vars`` into ``--conf spark.yarn.appMasterEnv.K=V`` (YARN) or
``--conf spark.kubernetes.driverEnv.K=V`` (Kubernetes) arguments, which the process list,
the task log (the provider masks only names with ``secret`` or ``password``) and the driver
pod's spec show. So the submitting side writes every connection variable (the Kafka
settings, the schema registry's, object-store keys, the Iceberg catalog's URL, the masking key) into one JSON
file, readable by its user only (0600, in a 0700 folder of its own), and passes only the
file's path, :data:`SECRETS_FILE_ENV`, in the environment; the file is removed once
``spark-submit`` is done (:func:`secrets_file`). The driver, in client deploy mode a child of
``spark-submit`` on the same host, reads it before anything else (:func:`load_secrets`); the
executors get the Kafka settings inside the read's tasks, as before.

A deployment whose driver runs elsewhere (cluster deploy mode) points :data:`SECRETS_FILE_ENV`
at a secret it mounts there instead: the same JSON file, or a folder with one file per
variable, as a Kubernetes secret volume lays it out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from pathlib import Path

from tidemark.config.masking import MASKING_KEY_ENV
from tidemark.errors import ConfigError
from tidemark.kafka.connection import ENV_BOOTSTRAP, ENV_PREFIX, NOT_CLIENT_SETTINGS

SECRETS_FILE_ENV = "TIDEMARK_SECRETS_FILE"
# The variables that carry a connection (its address or its credentials): they travel in the file only.
CONNECTION_VARIABLES = frozenset({
    ENV_BOOTSTRAP, "TIDEMARK_SCHEMA_REGISTRY_URL", "TIDEMARK_SCHEMA_REGISTRY_USERNAME",
    "TIDEMARK_SCHEMA_REGISTRY_PASSWORD", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "TIDEMARK_ICEBERG_CATALOG_URI", "TIDEMARK_CHECKPOINT_URL", MASKING_KEY_ENV,
})  # fmt: skip
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_connection_variable(name: str) -> bool:
    """Whether the variable ``name`` carries a connection's address or credentials (so travels in the file)."""
    return name in CONNECTION_VARIABLES or (name.startswith(ENV_PREFIX) and name not in NOT_CLIENT_SETTINGS)


def split_env(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``env`` as (what may stay in a process's environment, the connection variables for the file)."""
    kept = {k: v for k, v in env.items() if not is_connection_variable(k)}
    return kept, {k: v for k, v in env.items() if is_connection_variable(k)}


@contextmanager
def secrets_file(values: Mapping[str, str]) -> Iterator[str | None]:
    """The path of a new file holding ``values`` (JSON), readable by this user only; removed when the block ends.

    ``None`` when there is nothing to hand over. The folder is ``tempfile.mkdtemp``'s (0700, under
    ``TMPDIR``); the file is created 0600 before anything is written to it.
    """
    if not values:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="tidemark-secrets-")
    path = os.path.join(folder, "connections.json")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(dict(values), handle)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def load_secrets(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Set the variables of the file (or secret folder) :data:`SECRETS_FILE_ENV` names in ``environ``.

    Returns their names (none when the variable is unset). The driver calls this first, so that
    :func:`~tidemark.kafka.connection.from_env` and the other ``from_env`` readers find them.
    """
    env = os.environ if environ is None else environ
    where = env.get(SECRETS_FILE_ENV, "").strip()
    if not where:
        return []
    path = Path(where)
    try:
        values = _folder_values(path) if path.is_dir() else json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"{SECRETS_FILE_ENV}={where}: cannot read it ({exc.strerror}); the Airflow task writes it for the "
            "driver in client deploy mode, a cluster-mode deployment must mount it where the driver runs"
        ) from None
    except ValueError:
        raise ConfigError(f"{SECRETS_FILE_ENV}={where} is not a JSON object of variables") from None
    if not isinstance(values, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        raise ConfigError(f"{SECRETS_FILE_ENV}={where} is not a JSON object of variables (names to text values)")
    env.update(values)
    return sorted(values)


def _folder_values(folder: Path) -> dict[str, str]:
    """A mounted secret's folder: one file per variable (Kubernetes' ``..data`` links and dot files skipped)."""
    return {
        item.name: item.read_text(encoding="utf-8")
        for item in sorted(folder.iterdir())
        if _VARIABLE_NAME.fullmatch(item.name) and item.is_file()
    }
