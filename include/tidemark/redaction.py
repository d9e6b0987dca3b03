"""Secrets kept out of every text Tidemark writes or shows: one marker, one walk, one URL rule.

Whatever finds a secret (a connection's secret settings, a password written into a URL,
the environment's credentials: :func:`tidemark.runs.report.secret_values`) hands the
values here, and every writer replaces them the same way: :func:`redact` over a text or
JSON-like data (reports, the view's pages and errors, the checkpoint store's and the
schema registry's errors), :func:`redact_url` for a URL shown in a message, and
:data:`REDACTED` where a setting's value is described (``KafkaConnection.describe``). A
core leaf: it imports nothing of Tidemark's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

REDACTED = "***"


def replace_everywhere(value: Any, replacements: Mapping[str, str]) -> Any:
    """``value`` (a text, or mappings and lists holding texts, keys included) with each key of
    ``replacements`` replaced by its value, longest first (so a secret holding a shorter one goes whole)."""
    found = sorted(replacements.items(), key=lambda kv: len(kv[0]), reverse=True)
    if not found:
        return value

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            for text, replacement in found:
                v = v.replace(text, replacement)
            return v
        if isinstance(v, Mapping):
            return {walk(k): walk(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return v

    return walk(value)


def redact(value: Any, secrets: Iterable[str | None]) -> Any:
    """``value`` with every occurrence of a secret replaced by :data:`REDACTED`, recursively."""
    return replace_everywhere(value, dict.fromkeys({s for s in secrets if s}, REDACTED))


def password_forms(password: str | None) -> set[str]:
    """A password as given and as written into a URL (percent-encoded): the forms an error text may hold."""
    return {password, quote(password, safe="")} - {""} if password else set()


def redact_url(url: str) -> str:
    """``url`` with its password replaced by :data:`REDACTED` (safe for messages and logs)."""
    # SQLAlchemy's URL parser, as the checkpoint store and the Iceberg catalog read these URLs; loaded on
    # the first URL shown, so that importing this core leaf costs nothing.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable URL>"
