"""A feed's sensitive fields (``masking:``): which parts of a record are masked, and how.

A feed names value fields by their path (``customer.email``: dots walk into nested
records, and through arrays of records, ``items.sku`` masking every item's ``sku``), the
Kafka key (``key``) and headers by name (``headers``, matched whatever their case), each with a treatment:

- ``drop``: the field is removed from its record (the key becomes null, the header is removed);
- ``hash``: HMAC-SHA256 under a key of the feed and the field (:func:`field_key`: HKDF-SHA256 from the
  deployment's masking key), as 64 lower-case hex digits (within one feed and field the same value gives the
  same digest, so masked values still join and count; across feeds or fields they differ);
- ``redact``: the fixed marker :data:`MASKED`;
- ``{truncate: N}``: the first N characters of a text (bytes of a binary value).

``keep_raw`` names a separately secured location (a local folder or ``s3://...``, never
inside the feed's output) that receives the raw key, value and headers of the feed's
quarantined records; without it the quarantine holds only masked columns and no raw bytes.

The paths are checked when the feed loads against the declared JSON schema (``fields`` or
``schema_ddl``, read by :func:`tidemark.config.declared.ddl_fields`, so that loading a feed needs no
Spark); an Avro feed's when a run is planned, against the reader schema the registry gives
(:func:`tidemark.config.declared.avro_fields`); every format's by the job against the decoded records
(:func:`tidemark.spark.masking.mask_records`). Masking itself happens in the Spark job right
after decoding: see :mod:`tidemark.spark.masking`.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import string
from collections import Counter
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from tidemark.config.declared import STRING_TYPES, DeclaredField

MASKED = "[masked]"
MASKING_KEY_ENV = "TIDEMARK_MASKING_KEY"  # the root of ``hash``'s keys (an Airflow connection's password in DAGs)
KEY_BITS = 256  # the least a masking key must carry, as random bits
# Below this many bits of character entropy (Shannon, per character), a key is text, a pattern or a repetition.
KEY_MIN_CHAR_ENTROPY = 3.0
KEY_ENTROPY_SHARE = 0.75  # ... and below this share of what its alphabet and length allow
# HKDF-SHA256's ``info`` for a field's key: this label, the feed's name and the field's name, NUL-separated.
KEY_INFO = b"tidemark masking v1"

Named = Literal["drop", "hash", "redact"]
PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class Truncate(BaseModel):
    """``{truncate: N}``: keep the first N characters (bytes of a binary value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    truncate: PositiveInt


Treatment = Named | Truncate


def treatment_name(treatment: Treatment) -> str:
    """``drop``, ``hash``, ``redact`` or ``truncate``."""
    return treatment if isinstance(treatment, str) else "truncate"


class Masking(BaseModel):
    """``masking:``: value fields by path, the key and headers by name, each with its treatment; ``keep_raw``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fields: dict[str, Treatment] = Field(default_factory=dict)
    key: Treatment | None = None
    headers: dict[str, Treatment] = Field(default_factory=dict)
    keep_raw: str | None = Field(default=None, min_length=1)

    @field_validator("fields")
    @classmethod
    def _paths_ok(cls, v: dict[str, Treatment]) -> dict[str, Treatment]:
        for path in v:
            if not PATH.match(path):
                raise ValueError(
                    f"masking.fields: {path!r} is not a field path (names joined by dots, e.g. customer.email)"
                )
        nested = [(a, b) for a in v for b in v if b.startswith(a + ".")]
        if nested:
            a, b = nested[0]
            raise ValueError(f"masking.fields: {b!r} lies inside {a!r}, which is masked whole; name one of them")
        return v

    @field_validator("headers")
    @classmethod
    def _header_names_ok(cls, v: dict[str, Treatment]) -> dict[str, Treatment]:
        if any(not name for name in v):
            raise ValueError("masking.headers: a header name is empty")
        seen: dict[str, str] = {}
        for name in v:  # headers are matched whatever their case: two names that differ by case only are one
            if name.lower() in seen:
                raise ValueError(
                    f"masking.headers: {seen[name.lower()]!r} and {name!r} name the same header (names are matched "
                    "whatever their case); keep one"
                )
            seen[name.lower()] = name
        return v

    @property
    def hashes(self) -> bool:
        """Whether any treatment is ``hash`` (so the job needs the masking key)."""
        return "hash" in (*self.fields.values(), self.key, *self.headers.values())

    @property
    def dropped(self) -> tuple[str, ...]:
        """The value paths dropped from the record."""
        return tuple(p for p, t in self.fields.items() if t == "drop")


def key_problem(key: str) -> str | None:
    """Why ``key`` (the deployment's masking key) is too weak to derive the feeds' keys from, or None.

    It must carry at least :data:`KEY_BITS` random bits, counted as its length times the bits a character of
    its alphabet can carry (hex digits 4, base64 6, other printable text 6.5, anything else 8 per byte), and
    look random: not a repetition of a shorter text, with at least :data:`KEY_MIN_CHAR_ENTROPY` bits of entropy
    per character (which refuses ``aaaa...``, ``abab...`` and words).
    """
    if not key:
        return "it is unset"
    if set(key) <= set(string.hexdigits):
        per_char = 4.0
    elif set(key) <= set(string.ascii_letters + string.digits + "+/-_="):
        per_char = 6.0
    elif set(key) <= set(string.printable) - set("\t\n\r\x0b\x0c"):
        per_char = 6.5
    else:
        per_char = 8.0 * len(key.encode()) / len(key)
    bits = len(key) * per_char
    if bits < KEY_BITS:
        return f"it is too short: {len(key)} characters carry at most {bits:.0f} bits, fewer than {KEY_BITS}"
    period = next((n for n in range(1, len(key) // 2 + 1) if len(key) % n == 0 and key == key[:n] * (len(key) // n)),
                  None)  # fmt: skip
    if period is not None:
        return f"it is one text of {period} characters repeated"
    counts = Counter(key)
    entropy = -sum(c / len(key) * math.log2(c / len(key)) for c in counts.values())
    # A random key's characters spread over its alphabet (or over as many as it has characters): measured, 64
    # random hex digits have 3.6 to 4.0 bits per character, 43 random base64 ones 4.7 to 5.3, English text 3.9 to 4.2.
    if entropy < max(KEY_MIN_CHAR_ENTROPY, KEY_ENTROPY_SHARE * min(per_char, math.log2(len(key)))):
        return (
            f"it has low entropy ({entropy:.1f} bits per character, {len(counts)} distinct characters): "
            "it is not random"
        )
    return None


def field_key(root: bytes, feed: str, field: str) -> bytes:
    """The HMAC key of ``hash`` for ``field`` of ``feed``: HKDF-SHA256 (RFC 5869) of the deployment's masking key
    ``root``, no salt, ``info`` = :data:`KEY_INFO`, the feed's name and the field's, NUL-separated; 32 bytes.

    ``field``: a value field's path (``customer.email``), ``key``, or ``headers.<name>`` (the header's name in
    lower case). Two feeds, or two fields of one feed, hash one value to unrelated digests: a team that hashes
    guesses through its own feed learns nothing of another's hashed values, and hashes do not join across them.
    """
    prk = hmac.new(b"\0" * hashlib.sha256().digest_size, root, hashlib.sha256).digest()  # extract
    info = b"\0".join((KEY_INFO, feed.encode(), field.encode()))
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()  # expand: one block is the 32 bytes


def path_problem(path: str, treatment: Treatment, declared: Mapping[str, DeclaredField]) -> str | None:
    """Why ``path`` cannot be masked with ``treatment`` in ``declared`` (a missing field, a truncate of a
    non-text), or None."""
    here: Mapping[str, DeclaredField] | None = declared
    walked: list[str] = []
    found: DeclaredField | None = None
    for name in path.split("."):
        if here is None:
            kind = found.type if found else "?"
            return f"'{'.'.join(walked)}' is of type {kind}, not a record: it has no field '{name}'"
        if name not in here:
            known = ", ".join(sorted(here)) or "none"
            where = f"'{'.'.join(walked)}'" if walked else "the declared schema"
            return f"{where} has no field '{name}' (its fields: {known})"
        found = here[name]
        walked.append(name)
        here = found.fields
    if isinstance(treatment, Truncate) and found is not None and found.type not in STRING_TYPES:
        return f"truncate needs a string or binary field; '{path}' is of type {found.type}"
    return None


def masking_problems(masking: Masking, declared: Mapping[str, DeclaredField]) -> list[str]:
    """Every masked path of ``masking`` that ``declared`` cannot take, as ``masking.fields.<path>: <why>``."""
    found = ((path, path_problem(path, treatment, declared)) for path, treatment in masking.fields.items())
    return [f"masking.fields.{path}: {problem}" for path, problem in found if problem is not None]
