"""A feed's sensitive fields (``masking:``): which parts of a record are masked, and how.

A feed names value fields by their path (``customer.email``: dots walk into nested
records, and through arrays of records, ``items.sku`` masking every item's ``sku``), the
Kafka key (``key``) and headers by name (``headers``), each with a treatment:

- ``drop``: the field is removed from its record (the key becomes null, the header is removed);
- ``hash``: HMAC-SHA256 under the deployment's masking key, as 64 lower-case hex digits
  (the same value and key give the same digest: masked values still join and count);
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

import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from tidemark.config.declared import STRING_TYPES, DeclaredField

MASKED = "[masked]"
MASKING_KEY_ENV = "TIDEMARK_MASKING_KEY"  # the HMAC key of ``hash`` (an Airflow connection's password in DAGs)

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
        return v

    @property
    def hashes(self) -> bool:
        """Whether any treatment is ``hash`` (so the job needs the masking key)."""
        return "hash" in (*self.fields.values(), self.key, *self.headers.values())

    @property
    def dropped(self) -> tuple[str, ...]:
        """The value paths dropped from the record."""
        return tuple(p for p, t in self.fields.items() if t == "drop")


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
