"""The library's exception hierarchy.

Every error Tidemark raises on purpose derives from :class:`TidemarkError`, so the CLI,
the Spark job and the DAG tasks can tell "we refused, and said why" from a bug. Messages
name what is wrong (file and field, topic, partition and offsets) and what to do next.
"""

from __future__ import annotations

from typing import Any

QUOTE_CHARS = 80


def shown(value: Any) -> str:
    """An input as a message quotes it: its repr, cut at ``QUOTE_CHARS`` characters."""
    text = repr(value)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "…"


class TidemarkError(Exception):
    """Base class of every error Tidemark raises deliberately."""


class ConfigError(TidemarkError):
    """A feed file, a setting or a trigger parameter is invalid."""


class LocalKafkaError(TidemarkError):
    """The embedded local Kafka cluster could not be fetched, started or stopped."""


class KafkaUnavailableError(TidemarkError):
    """Brokers did not answer in time, or answered with an error for a whole request."""


class AuthorizationError(TidemarkError):
    """The connection's principal lacks an ACL: the message names the principal, the resource and the operation."""


class PlanningError(TidemarkError):
    """The planner refused to plan (data loss, offsets ahead of the log, missing offsets)."""


class DataLossError(PlanningError):
    """Unread records were deleted by retention and the feed's policy is ``fail``."""


class OffsetAheadError(PlanningError):
    """The start offset lies past the end of the log and the feed's policy is ``fail``."""


class ReadError(TidemarkError):
    """Reading a planned range failed (offset vanished, broker error, incomplete range)."""


class ValidationFailedError(TidemarkError):
    """The data read did not pass the built-in checks or the feed's expectations."""


class PublishError(TidemarkError):
    """Publishing the output failed or found a conflicting earlier publication."""


class CommitError(TidemarkError):
    """Committing the group's offsets was refused or could not be verified."""


class GroupInUseError(CommitError):
    """The consumer group has active members; committing from outside would race them."""


class OffsetsMovedError(CommitError):
    """The group's committed offsets changed after the plan was made."""


class LocalServerError(TidemarkError):
    """A local test server (PostgreSQL, the S3 endpoint) could not be installed, started or stopped."""


class StateStoreError(TidemarkError):
    """The checkpoint store or the storage holding state and outputs refused a request or was unreachable."""


class RegistryUnavailableError(TidemarkError):
    """The schema registry could not be reached, refused the credentials or failed a request."""


class SchemaNotFoundError(TidemarkError):
    """The schema registry does not know a schema id, subject or version a run needs."""


class SchemaError(ReadError):
    """Records Tidemark cannot decode as a whole: unsupported framing, or a writer schema the reader cannot resolve."""


class StuckRunError(TidemarkError):
    """A run of the feed that committed (or may have) cannot be shown; nothing new is planned before it is."""
