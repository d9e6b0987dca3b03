"""The masking key (pure, no Spark): read from the environment, refused when unset or one hex digit short of 256
random bits, and never named in a message."""

from __future__ import annotations

import pytest

from tidemark.config.masking import MASKING_KEY_ENV, Masking
from tidemark.errors import ConfigError
from tidemark.spark.masking import masking_key

HASHING = Masking(fields={"email": "hash"})
HEX_64 = "3f0c291e26de8216da5960b07b3e507420e5b1c3437d90af547e07dd4d69d5f1"  # 256 bits, as token_hex(32) gives
REMEDY = "to at least 256 random bits"


@pytest.mark.parametrize(("length", "accepted"), [(63, False), (64, True)])
def test_a_hex_key_one_digit_short_of_256_bits_is_refused_and_64_digits_are_enough(length: int, accepted: bool) -> None:
    key = HEX_64[:length]
    if accepted:
        assert masking_key(HASHING, "orders", {MASKING_KEY_ENV: key}) == key.encode()
        return
    with pytest.raises(ConfigError) as err:
        masking_key(HASHING, "orders", {MASKING_KEY_ENV: key})
    message = str(err.value)
    assert message.startswith(f"feed 'orders': masking hashes with keys derived from {MASKING_KEY_ENV}, and it is "
                              "too short: 63 characters carry at most 252 bits, fewer than 256")  # fmt: skip
    assert REMEDY in message and key not in message  # the secret is never in the message


def test_an_unset_or_empty_key_is_refused_as_unset() -> None:
    for environ in ({}, {MASKING_KEY_ENV: ""}):
        with pytest.raises(ConfigError) as err:
            masking_key(HASHING, "orders", environ)
        assert f"keys derived from {MASKING_KEY_ENV}, and it is unset" in str(err.value)
        assert REMEDY in str(err.value)


def test_the_process_environment_is_read_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    other = HEX_64[::-1]
    monkeypatch.setenv(MASKING_KEY_ENV, HEX_64)
    assert masking_key(HASHING, "orders") == HEX_64.encode()
    assert masking_key(HASHING, "orders", {MASKING_KEY_ENV: other}) == other.encode()
    monkeypatch.delenv(MASKING_KEY_ENV)
    with pytest.raises(ConfigError, match="is unset"):
        masking_key(HASHING, "orders")
    assert masking_key(Masking(fields={"email": "redact"}), "orders") is None  # nothing hashed: no key needed
