"""Differential, property-based, end to end: generated Protobuf messages through whole runs against the runtime.

The shapes of :mod:`tests.unit.spark.test_protobuf_differential` (scalars of every kind,
nested messages, repeated fields, maps, a oneof, enums, ``google.protobuf.Timestamp``),
a writer and an evolved reader the compatibility rules allow, each registered in the real
registry (the ``registry`` fixture) by confluent-kafka's ``ProtobufSerializer``, which also
frames the records produced to the real cluster; corrupted bodies and Timestamps outside
years 1-9999 among them. One run of a ``protobuf`` feed (Spark's path: the Python workers
decode).

The oracle never runs Tidemark's code: a ``read_committed`` scan of the topic, each body
parsed by a class the runtime builds (``descriptor_pool``, ``message_factory``) from the
subject's latest version fetched in its serialized form with confluent-kafka's registry
client. A record is published with the runtime's values exactly when the runtime parses it
into values a column holds; every other record is quarantined.

``make test`` runs :data:`EXAMPLES` (1); ``TIDEMARK_DIFF_E2E_EXAMPLES`` sets more
(``make test-differential``, ``make differential``). The counts are printed at the end of the module.
"""

from __future__ import annotations

import base64
import os
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import env_of
from tests.integration.job.test_json_schema_fidelity import FidelityEnv
from tests.support.differential import comparable, report_counts
from tests.unit.spark import test_protobuf_differential as diff

pytestmark = [pytest.mark.integration, pytest.mark.spark]

EXAMPLES = int(os.environ.get("TIDEMARK_DIFF_E2E_EXAMPLES", "1"))
RECORDS = 200  # writer messages per example
COUNTS: Counter[str] = Counter()


def _runtime_reader_class(env: FidelityEnv) -> Any:
    """The reader's class as the runtime builds it from the subject's latest version (serialized), not Tidemark."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    latest = env.sr.get_latest_version(f"{env.topic}-value", fmt="serialized")
    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(latest.schema.schema_str))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb))
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(diff.MESSAGE))


# Every example holds these too: a Timestamp alone and repeated, a map of messages, a oneof of an enum and a string,
# an optional uint64 (whatever the generated part of the shape holds).
ANCHORS = (
    diff.Field("at", 50, "timestamp", "one"), diff.Field("ats", 51, "timestamp", "repeated"),
    diff.Field("lines", 52, "inner", "map"), diff.Field("color", 53, "enum", "oneof"),
    diff.Field("note", 54, "string", "oneof"), diff.Field("qty", 55, "uint64", "optional"),
)  # fmt: skip


@st.composite
def anchored_pairs(draw: st.DrawFn) -> diff.Pair:
    """A compatible evolution of :func:`diff.pairs`, both sides holding :data:`ANCHORS`."""
    pair = draw(diff.pairs().filter(lambda p: p.refused is None and p.reader != p.writer))
    return diff.Pair(
        replace(pair.writer, fields=pair.writer.fields + ANCHORS),
        replace(pair.reader, fields=pair.reader.fields + ANCHORS),
        None,
    )


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    report_counts(request, "Protobuf end to end", EXAMPLES, COUNTS)


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(pair=anchored_pairs(), rng=st.randoms(use_true_random=True))
def test_differential_protobuf_generated_messages_end_to_end_publish_what_the_runtime_parses(
    pair: diff.Pair,
    rng: random.Random,
    kafka: KafkaTestCluster,
    registry: str,
    spark: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    writer_cls, _ = diff.classes(pair.writer)
    reader_cls, _ = diff.classes(pair.reader)
    with pytest.MonkeyPatch.context() as monkeypatch:
        env = env_of(FidelityEnv, kafka, registry, tmp_path_factory.mktemp("proto-diff"), spark, monkeypatch)
        env.write_feed(format="protobuf")
        ctx = SerializationContext(env.topic, MessageField.VALUE)
        conf = {"auto.register.schemas": True, "use.deprecated.format": False}
        by_writer = ProtobufSerializer(writer_cls, env.sr, conf)
        by_reader = ProtobufSerializer(reader_cls, env.sr, conf)

        def messages(cls: Any, shape: diff.Shape, n: int) -> list[Any]:
            out = []
            for _ in range(n):
                m = cls()
                diff.fill(m, shape.fields, shape.inner, rng, True, len(shape.colors))
                out.append(m)
            return out

        values = [by_writer(m, ctx) for m in messages(writer_cls, pair.writer, RECORDS)]  # registers the writer first
        values += [by_reader(m, ctx) for m in messages(reader_cls, pair.reader, RECORDS // 4)]
        bad = [b for v in values[:3] for b in diff.corrupted(v, rng)]
        values += bad
        rng.shuffle(values)
        for partition in range(2):
            env.produce(values[partition::2], partition)

        env.run()

        runtime = _runtime_reader_class(env)
        expected = env.scan_with(lambda v: diff.oracle(runtime, v))
        published = env.published()
        quarantined = {(q["partition"], q["offset"]): q["_reason"] for q in env.quarantined()}
    good = {k for k, v in expected.items() if isinstance(v, dict)}
    assert published.keys() == good, sorted(published.keys() ^ good)[:10]
    assert quarantined.keys() == expected.keys() - good
    out_of_range = {k for k, v in expected.items() if v == "out of range"}
    assert all("google.protobuf.Timestamp outside years 1 to 9999" in quarantined[k] for k in out_of_range)
    names = [f.name for f in runtime.DESCRIPTOR.fields]
    wrong = [
        (k, published[k], expected[k])
        for k in sorted(good)
        if comparable({n: published[k][n] for n in names}) != comparable(expected[k])
    ]
    assert wrong == [], wrong[:2]
    assert env.committed() == {p: sum(1 for q, _ in expected if q == p) for p in range(2)}
    COUNTS["schemas"] += 1
    COUNTS["fields (writer, reader)"] += len(pair.writer.fields) + len(pair.reader.fields)
    COUNTS["records published as the runtime parses them"] += len(good)
    COUNTS["records quarantined (the runtime refuses them)"] += len(expected) - len(good) - len(out_of_range)
    COUNTS["records quarantined (a Timestamp outside years 1-9999)"] += len(out_of_range)
