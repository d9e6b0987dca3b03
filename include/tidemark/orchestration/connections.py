"""The Kafka connection as Airflow holds it, for the DAGs' tasks, the triggerer's lag triggers and the view.

A leaf of the orchestration layer: :mod:`tidemark.orchestration.dags` builds the lag triggers and
the triggers resolve their connection here, so neither imports the other.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook

from tidemark.errors import ConfigError
from tidemark.kafka.connection import (
    CALLBACK_SETTINGS,
    KafkaConnection,
    allowed_settings,
    from_airflow_extra,
    from_env,
    is_secret,
)

KAFKA_CONN_ID = os.environ.get("TIDEMARK_KAFKA_CONN_ID", "tidemark_kafka")


def kafka_connection(conn_id: str = KAFKA_CONN_ID) -> KafkaConnection:
    """The Kafka connection from Airflow, else the ``TIDEMARK_*`` environment."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - any lookup failure means "not configured in Airflow"
        return _masked(from_env())
    extra = conn.extra_dejson
    _check_callbacks(conn_id, extra)
    return _masked(from_airflow_extra(extra, conn_id, allowed=_allowed_settings()))


def _allowed_settings() -> frozenset[str]:
    """The file- and URL-reading librdkafka settings the deployment lets connections set:
    ``TIDEMARK_ALLOWED_KAFKA_SETTINGS`` and ``[tidemark] allowed_kafka_settings``."""
    from airflow.providers.common.compat.sdk import conf

    return allowed_settings(extra=conf.get("tidemark", "allowed_kafka_settings", fallback="") or "")


def _masked(connection: KafkaConnection) -> KafkaConnection:
    """``connection``, each secret value registered with Airflow's secrets masker.

    Airflow masks an extra's values only under the names it knows as sensitive (``password``,
    ``private_key``, ...): ``ssl.key.pem`` or ``sasl.oauthbearer.config`` would reach task logs in clear.
    """
    from airflow.sdk.log import mask_secret

    for key, value in connection.settings.items():
        if value and is_secret(key):
            mask_secret(value)
    return connection


def _check_callbacks(conn_id: str, extra: Mapping[str, Any]) -> None:
    """Callbacks named in a connection's extra are imported only if ``[apache_kafka] callback_allowlist`` lists
    them, the Kafka provider's own rule (anyone who may edit a connection could otherwise name any code)."""
    from airflow.providers.common.compat.sdk import conf

    allowed = {p.strip() for p in (conf.get("apache_kafka", "callback_allowlist", fallback="") or "").split(",")}
    for key in CALLBACK_SETTINGS:
        path = extra.get(key)
        if isinstance(path, str) and path not in allowed:
            raise ConfigError(
                f"the Airflow connection '{conn_id}' names the callback {key}={path!r}, which "
                "[apache_kafka] callback_allowlist does not list; add its full path there (as for the Kafka "
                "provider's hooks) or remove it from the connection"
            )
