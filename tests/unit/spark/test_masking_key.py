"""The masking key (pure, no Spark): read from the environment, refused when unset or one character short."""

from __future__ import annotations

import pytest

from tidemark.config.masking import MASKING_KEY_ENV, Masking
from tidemark.errors import ConfigError
from tidemark.spark.masking import masking_key

HASHING = Masking(fields={"email": "hash"})
REMEDY = (
    "set it (in Airflow: the password of the 'tidemark_masking' connection) to a long random secret, the same for "
    "every run of the feed"
)


@pytest.mark.parametrize(("length", "accepted"), [(15, False), (16, True), (17, True)])
def test_a_key_shorter_than_16_characters_is_refused_and_16_is_enough(length: int, accepted: bool) -> None:
    key = "k" * length
    if accepted:
        assert masking_key(HASHING, "orders", {MASKING_KEY_ENV: key}) == key.encode()
        return
    with pytest.raises(ConfigError) as err:
        masking_key(HASHING, "orders", {MASKING_KEY_ENV: key})
    assert str(err.value) == (
        f"feed 'orders': masking hashes with a key, and {MASKING_KEY_ENV} is shorter than 16 characters; {REMEDY}"
    )
    assert key not in str(err.value)  # the secret is never in the message


def test_an_unset_or_empty_key_is_refused_as_unset() -> None:
    for environ in ({}, {MASKING_KEY_ENV: ""}):
        with pytest.raises(ConfigError) as err:
            masking_key(HASHING, "orders", environ)
        assert str(err.value) == f"feed 'orders': masking hashes with a key, and {MASKING_KEY_ENV} is unset; {REMEDY}"


def test_the_process_environment_is_read_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MASKING_KEY_ENV, "a-key-from-the-environment")
    assert masking_key(HASHING, "orders") == b"a-key-from-the-environment"
    assert masking_key(HASHING, "orders", {MASKING_KEY_ENV: "another-given-key-16"}) == b"another-given-key-16"
    monkeypatch.delenv(MASKING_KEY_ENV)
    with pytest.raises(ConfigError, match="is unset"):
        masking_key(HASHING, "orders")
    assert masking_key(Masking(fields={"email": "redact"}), "orders") is None  # nothing hashed: no key needed
