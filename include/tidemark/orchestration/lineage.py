"""OpenLineage datasets of a run, reported through Airflow's OpenLineage provider.

The plan task describes the run's datasets from its plan (:func:`describe`, into XCom); the
Spark task (:class:`~tidemark.orchestration.dags.TidemarkSparkSubmitOperator`) reports them
on its START and COMPLETE events: every topic it reads as an input dataset and where the
run publishes as the output dataset. The provider's listener sends them to whatever
``[openlineage] transport`` the deployment configured (nothing is sent when the provider
is disabled or has no transport).

- Inputs: namespace ``kafka://<host:port>`` of the connection's first bootstrap server (as
  OpenLineage names Kafka; only host and port: a listener name or user info is dropped),
  name = the topic, with the facet ``tidemark_offsets``: the plan's ``[start, end)`` per partition.
- Output: a Parquet folder as Airflow's own asset converters name it (``file`` + the
  absolute path, or ``s3://<bucket>`` + the key), the names the feed's Asset gets too; an
  Iceberg table as namespace ``iceberg://tidemark`` (Tidemark's catalog name) and the
  table's identifier.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import InputDatasetFacet

from tidemark.config.models import Feed
from tidemark.planning.plan import Plan
from tidemark.storage import Location

OFFSETS_FACET = "tidemark_offsets"
ICEBERG_NAMESPACE = "iceberg://tidemark"
# No published JSON schema: docs/guide/observe.md, "Lineage", describes the facet; a URN names it and its version.
FACET_SCHEMA = "urn:tidemark:openlineage:facet:tidemark_offsets:1"


@attr.define
class OffsetRangesInputDatasetFacet(InputDatasetFacet):  # type: ignore[misc]
    """The offsets a run reads from one topic: ``[{"partition", "start", "end"}]``, end exclusive."""

    partitions: list[dict[str, int]] = attr.field(factory=list)

    @staticmethod
    def _get_schema() -> str:
        return FACET_SCHEMA


def kafka_namespace(bootstrap_servers: str) -> str:
    """``kafka://host:port`` of the first bootstrap server, without a listener name or user info."""
    first = bootstrap_servers.split(",")[0].strip()
    hostport = first.rpartition("://")[2].rpartition("@")[2].partition("/")[0]
    return f"kafka://{hostport}"


def describe(feed: Feed, plan: Plan, bootstrap_servers: str) -> dict[str, Any]:
    """The run's datasets as plain JSON: computed by the plan task, handed to the Spark task through XCom.

    The provider extracts lineage in a forked child of the task, where connection and XCom
    lookups through the supervisor are not available; a rendered template field is.
    """
    by_topic: dict[str, list[dict[str, int]]] = {}
    for p in plan.partitions:
        by_topic.setdefault(p.topic, []).append({"partition": p.partition, "start": p.start, "end": p.end})
    namespace = kafka_namespace(bootstrap_servers)
    return {
        "inputs": [{"namespace": namespace, "name": topic, "partitions": ranges} for topic, ranges in by_topic.items()],
        "output": _output(feed, plan),
    }


def _output(feed: Feed, plan: Plan) -> dict[str, str]:
    """Where the plan publishes, as :func:`tidemark.output.base.publisher_for` decides."""
    if not plan.output and feed.output_format == "iceberg":
        return {"namespace": ICEBERG_NAMESPACE, "name": feed.iceberg_table}
    where = Location.of(plan.output) if plan.output else feed.output_location()
    if where.is_local:
        return {"namespace": "file", "name": str(where.local_path().resolve())}
    parts = urlsplit(where.url)
    return {"namespace": f"{parts.scheme}://{parts.netloc}", "name": parts.path.lstrip("/")}


def operator_lineage(doc: Mapping[str, Any]) -> OperatorLineage:
    """The provider's ``OperatorLineage`` of a run :func:`describe` gave."""
    inputs = [
        InputDataset(
            namespace=i["namespace"],
            name=i["name"],
            inputFacets={OFFSETS_FACET: OffsetRangesInputDatasetFacet(partitions=list(i["partitions"]))},
        )
        for i in doc.get("inputs") or []
    ]
    out = doc.get("output")
    outputs = [OutputDataset(namespace=out["namespace"], name=out["name"])] if out else []
    return OperatorLineage(inputs=inputs, outputs=outputs)
