"""The embedded cluster's secured mode: who gets in, and what the authorizer lets them do.

One secured cluster per session (``secure_kafka``): SASL_SSL with SCRAM-SHA-512 and
OAUTHBEARER (unsecured JWTs), SSL with client certificates, ``StandardAuthorizer``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.conftest import SecuredKafka
from tidemark.devtools.kafka.secure import MECHANISMS, Mechanism
from tidemark.errors import KafkaUnavailableError, TidemarkError
from tidemark.kafka.adapter import KafkaAdapter

pytestmark = [pytest.mark.integration]


@pytest.mark.parametrize("pem", [False, True], ids=["files", "pem"])
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_each_mechanism_authenticates_and_the_authorizer_decides(
    secure_kafka: SecuredKafka, mechanism: Mechanism, pem: bool
) -> None:
    topic = secure_kafka.admin.new_topic(partitions=1, prefix="sec")
    principal = "feed"
    denied = KafkaAdapter(secure_kafka.cluster.connection(mechanism, principal, pem=pem), timeout_s=10)
    with pytest.raises(TidemarkError, match=f"User:{principal} may not Describe topic '{topic}'"):
        denied.partitions([topic])

    secure_kafka.cluster.grant(principal, [("topic", topic, "describe")])
    allowed = KafkaAdapter(secure_kafka.cluster.connection(mechanism, principal, pem=pem), timeout_s=10)
    assert [p.partition for p in allowed.partitions([topic])] == [0]


def test_a_wrong_password_and_a_plaintext_client_are_refused(secure_kafka: SecuredKafka) -> None:
    topic = secure_kafka.admin.new_topic(partitions=1, prefix="sec")
    good = secure_kafka.cluster.connection("scram", "feed")
    wrong = replace(good, settings={**good.settings, "sasl.password": "not-the-password"})
    with pytest.raises(KafkaUnavailableError):
        KafkaAdapter(wrong, timeout_s=4).partitions([topic])
    plaintext = replace(good, settings={})
    with pytest.raises(KafkaUnavailableError):
        KafkaAdapter(plaintext, timeout_s=4).partitions([topic])
