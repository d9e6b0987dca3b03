"""The one protocol a Schema Registry format implements for decoding, and the lookup of a format by its name.

:mod:`tidemark.spark.decode` decodes a key or value of a registry format (``avro``,
``json_schema``, ``protobuf``: :data:`tidemark.config.models.REGISTRY_FORMATS`) through a
:class:`RegistryFormat` and imports no format module: :func:`registry_format` imports the
module :data:`FORMAT_MODULES` names for the format, the first time it is asked for, and
returns the module's ``FORMAT`` (as pyiceberg finds a catalog's implementation by its type).
Decoding asks a format two things of a key or value:

1. :meth:`~RegistryFormat.reasons`: every reason a non-null key or value can fail to
   decode, in a fixed order (the job stages a bad record under its reason's index, so the
   list is bounded; with the run's schemas it may name the reader's fields);
2. :meth:`~RegistryFormat.decoding`: the part decoded in Spark (Avro by Spark's own
   ``from_avro``; JSON Schema and Protobuf in the Python workers), with one failure
   condition per reason (:class:`Reasons` where the workers give the reason itself).

The run's schemas come first: each format module builds them on the driver (the reader and
every writer seen, :mod:`tidemark.spark.wire`; ``resolve_schemas``, and Avro's
``candidate_schemas`` and ``settle``), called by the job (:mod:`tidemark.job.steps`), and
their ``format`` is the name of the format that built them. This module imports no format
module; a format imports this module and :mod:`tidemark.spark.wire`, never
:mod:`tidemark.spark.decode`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from tidemark.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from tidemark.config.models import RecordPart
    from tidemark.spark.wire import RegistrySchemas

# The module of each registry format, imported when the format is first asked for.
FORMAT_MODULES = {
    "avro": "tidemark.spark.avro",
    "json_schema": "tidemark.spark.json_schema",
    "protobuf": "tidemark.spark.protobuf",
}
S = TypeVar("S", bound="RegistrySchemas", contravariant=True)


@dataclass(frozen=True)
class Reasons:
    """A column giving the failure reason itself (null where none), standing for ``count`` reasons in a row."""

    column: Column
    count: int


Failure: TypeAlias = "Column | Reasons"  # a condition true where the reason at its place applies, or Reasons


@dataclass(frozen=True)
class PartDecoding:
    """A key or value decoded by a format: ``work`` (the input with the format's own columns added), the decoded
    ``parsed`` struct (or scalar) as it came, ``published`` (``parsed`` without decoding's own marks: what a key
    publishes) and ``failures``, one per :meth:`RegistryFormat.reasons` entry, in its order (a null key or value
    never fails here)."""

    work: DataFrame
    parsed: Column
    published: Column
    failures: list[Failure]


class RegistryFormat(Protocol[S]):
    """How :mod:`tidemark.spark.decode` decodes a key or value of one Schema Registry format."""

    @property
    def name(self) -> str:
        """The feed's name of the format (``deserialization.format``), and its schemas' ``format``."""
        ...

    def reasons(self, part: RecordPart, schemas: S | None) -> list[str]:
        """Why a non-null ``part`` (``key`` or ``value``) does not decode, in the order they are checked;
        ``schemas`` None (no run at hand) gives the reasons of any run's schemas."""
        ...

    def decoding(self, work: DataFrame, schemas: S, column: str, parsed_name: str) -> PartDecoding:
        """``work`` with ``column`` (``key`` or ``value``) decoded with the run's ``schemas`` as ``parsed_name``."""
        ...


def registry_format(name: str) -> RegistryFormat[Any]:
    """The registry format called ``name``, its module imported on first use."""
    try:
        module = FORMAT_MODULES[name]
    except KeyError:
        raise ConfigError(
            f"format {name!r} is not a Schema Registry format; Tidemark reads {sorted(FORMAT_MODULES)}"
        ) from None
    found: RegistryFormat[Any] = importlib.import_module(module).FORMAT
    return found
