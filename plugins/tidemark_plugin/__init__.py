"""Registers Tidemark's offsets/lag page with Airflow (Browse → Tidemark).

The page is a FastAPI app (``tidemark.web.app.create_app``) mounted at ``/tidemark`` and
shown in an iframe. Kafka settings come from the ``tidemark_kafka`` connection. Airflow
does not put plugin endpoints behind its auth, so the app carries Airflow's own auth
dependencies: every page and endpoint needs an authenticated Airflow user, and the
replay trigger a user who may run ``tidemark_replay`` (the re-drive form: ``tidemark_redrive``).
Each feed answers only to users Airflow's auth manager allows on that feed's DAG
(``tidemark.orchestration.access``). It shows offsets, lag and run summaries, never
connection settings.
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.plugins_manager import AirflowPlugin

from tidemark.orchestration.access import AirflowFeedAccess
from tidemark.orchestration.dags import airflow_api_base, airflow_auth, airflow_trigger_auth, kafka_connection
from tidemark.web.app import create_app, preview_rate


class TidemarkPlugin(AirflowPlugin):
    name = "tidemark"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [
        {
            "app": create_app(
                connection=kafka_connection,
                dependencies=airflow_auth(),
                trigger_dependencies=airflow_trigger_auth(),
                redrive_dependencies=airflow_trigger_auth("tidemark_redrive"),
                api_base=airflow_api_base,
                access=AirflowFeedAccess(),
                preview_rate=preview_rate(),
            ),
            "url_prefix": "/tidemark",
            "name": "Tidemark",
        }
    ]
    external_views: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "Tidemark offsets",
            "href": "/tidemark/",
            "destination": "nav",
            "category": "browse",
            "url_route": "tidemark",
        }
    ]
