"""Prose that names what the code no longer has: feed keys, CLI commands and flags, event kinds.

How prose names each, outside the generated ``docs/reference/`` (README.md and every page under ``docs/``):

- **feed keys**: a backticked key with its colon (`` `on_missing:` ``, `` `iceberg.mode: upsert` ``: the value is
  checked too where the key takes a fixed set), a backticked dotted path into a feed section
  (`` `masking.keep_raw` ``, `` `alerts.stale_after` ``), and every key of a fenced ``yaml`` block that holds a
  feed's top-level key (a feed file or a snippet of one);
- **CLI**: a backticked or fenced command line starting ``tidemark`` (or ``.venv/bin/tidemark``, ``$ tidemark``):
  its command words and every ``--flag`` after them; a bare backticked `` `--flag` `` outside the benchmark pages
  must be a ``tidemark`` flag or one of :data:`OTHER_TOOLS_FLAGS`;
- **event kinds**: a backticked name followed by the word *event(s)* (`` `data_loss` event``, `` `topic_added` /
  `topic_removed` events``), and `` `event.<kind>` `` metric names.

:func:`problems` lists each miss as ``file:line: what``; ``tests/unit/test_docs.py`` keeps the tree at none and
checks each rule on a planted mistake.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import types
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

from tests.support.docs_reference import ROOT, commands, event_kinds, feed_keys, flags
from tidemark.faults import FaultPoint

# Flags of other tools the prose names bare (spark-submit, Celery, pytest, the Spark job's entry point).
OTHER_TOOLS_FLAGS = frozenset(
    {
        "--conf",
        "--jars",
        "--packages",
        "--concurrency",
        "--queues",
        "--without-mingle",
        "--without-gossip",
        "--junitxml",
        "--ship-package",
        "--strict",
        # the benchmarks' own (tests/bench/*.py), which the design pages quote beside their figures
        "--bad",
        "--samples",
        "--cold-samples",
        "--variants",
        "--doc",
        "--feeds",
        "--minutes",
        "--runs",
        "--only",
        "--quick",
        "--records",
        "--rounds",
        "--profile",
    }
)
# Dotted spans with these endings are files (`trigger.json`), not key paths.
FILE_SUFFIXES = (".json", ".yaml", ".yml", ".md", ".py", ".png", ".html", ".txt", ".sqlite", ".jar", ".zip")

SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
KEY_WITH_COLON = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*):(?:\s+(.*))?$")
DOTTED = re.compile(r"^[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+$")
BARE_FLAG = re.compile(r"^(--[a-z][a-z0-9-]*)(?:[ =].*)?$")
COMMAND = re.compile(r"^(?:\$\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\.venv/bin/)?tidemark\s+(.*)$")
EVENT_CHAIN = re.compile(r"((?:`[a-z][a-z0-9_]*`\s*(?:/|,|or|and)\s*)*`[a-z][a-z0-9_]*`)\s+events?\b")
METRIC_EVENT = re.compile(r"(?:^|\.)event\.([a-z][a-z0-9_]*)$")


@dataclass(frozen=True)
class Known:
    """What the code has: feed key paths (``[]`` dropped), their fixed values, commands and their flags, kinds."""

    paths: frozenset[str]
    names: frozenset[str]
    sections: frozenset[str]
    open_paths: frozenset[str]  # mappings whose own keys are the user's (masking.fields, expectations' kwargs)
    choices: dict[str, frozenset[str]]
    commands: dict[tuple[str, ...], frozenset[str]]
    events: frozenset[str]


def _literal_values(annotation: Any) -> frozenset[str] | None:
    if get_origin(annotation) is Literal:
        return frozenset(str(a) for a in get_args(annotation))
    return None


def _is_mapping(annotation: Any) -> bool:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_is_mapping(a) for a in get_args(annotation))
    return origin is dict


def _is_model(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_is_model(a) for a in get_args(annotation))


@cache
def known() -> Known:
    keys = feed_keys()
    paths = frozenset(k.path.replace("[]", "") for k in keys)
    choices = {}
    for k in keys:
        values = _literal_values(k.field.annotation)
        if values is not None:
            choices[k.path.replace("[]", "")] = values
    return Known(
        paths=paths,
        names=frozenset(p.rsplit(".", 1)[-1] for p in paths),
        sections=frozenset(k.path for k in keys if "." not in k.path and _is_model(k.field.annotation)),
        open_paths=frozenset(k.path.replace("[]", "") for k in keys if _is_mapping(k.field.annotation)),
        choices=choices,
        commands={c.words: frozenset(flags(c.parser)) for c in commands()},
        events=frozenset(event_kinds()),
    )


def _path_known(path: str, k: Known) -> bool:
    return path in k.paths or any(path.startswith(p + ".") for p in k.open_paths)


def _check_key(span: str, k: Known) -> str | None:
    """`` `key:` `` names a feed key anywhere in the file; `` `a.b: value` `` a path, and the value where the key
    takes a fixed set. A bare word with a value (`` `records: 0` ``) is as often a report's field: not checked."""
    m = KEY_WITH_COLON.match(span)
    if not m:
        return None
    key, value = m.group(1), (m.group(2) or "").strip()
    if "." not in key:
        return None if value or key in k.names else f"unknown feed key `{key}`"
    if key.split(".", 1)[0] not in k.sections or _not_a_key(key):
        return None
    if not _path_known(key, k):
        return f"unknown feed key `{key}`"
    allowed = k.choices.get(key)
    if allowed and re.fullmatch(r"[a-z_]+", value) and value not in allowed:
        return f"`{key}` takes {', '.join(sorted(allowed))}, not `{value}`"
    return None


def _not_a_key(span: str) -> bool:
    """A dotted name that is a module of the library (`validation.rules`) or a fault point
    (`iceberg.before_commit`), not a path into a feed section."""
    if span in get_args(FaultPoint):
        return True
    parts = span.split(".")
    return any(_importable("tidemark." + ".".join(parts[:n])) for n in range(2, len(parts) + 1))


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _check_dotted(span: str, k: Known) -> str | None:
    if not DOTTED.match(span) or span.endswith(FILE_SUFFIXES):
        return None
    if span.split(".", 1)[0] not in k.sections or _not_a_key(span):
        return None
    return None if _path_known(span, k) else f"unknown feed key `{span}`"


def _check_command(line: str, k: Known) -> str | None:
    m = COMMAND.match(line.strip())
    if not m:
        return None
    try:
        words = shlex.split(m.group(1).split(" #", 1)[0], posix=True)
    except ValueError:
        words = m.group(1).split()
    path: tuple[str, ...] = ()
    rest = list(words)
    while rest and rest[0].startswith("--") and rest[0] in k.commands[()]:
        rest.pop(0)  # a global flag before the command (--kafka-log warning)
        if rest and not rest[0].startswith("-"):
            rest.pop(0)
    while rest and (*path, rest[0]) in k.commands:
        path = (*path, rest.pop(0))
    if not path:
        return f"unknown command `tidemark {words[0] if words else ''}`".rstrip()
    allowed = k.commands[path] | k.commands[()]
    for word in rest:
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and flag not in allowed:
            return f"`tidemark {' '.join(path)}` has no flag `{flag}`"
    return None


def _check_bare_flag(span: str, k: Known, name: str) -> str | None:
    m = BARE_FLAG.match(span)
    if not m or name.startswith("docs/benchmarks/"):
        return None
    flag = m.group(1)
    every = frozenset().union(*k.commands.values())
    return None if flag in every or flag in OTHER_TOOLS_FLAGS else f"no `tidemark` command has the flag `{flag}`"


def _yaml_problems(body: str, k: Known) -> Iterator[str]:
    try:
        doc = yaml.safe_load(body)
    except yaml.YAMLError:
        return
    top = {p for p in k.paths if "." not in p}
    if not isinstance(doc, dict) or not set(map(str, doc)) & top:
        return

    def walk(node: Any, prefix: str) -> Iterator[str]:
        if isinstance(node, list):
            for item in node:
                yield from walk(item, prefix)
            return
        if not isinstance(node, dict) or prefix in k.open_paths:
            return
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if prefix == "" and path == "topics" and isinstance(value, dict):
                yield from walk(value, "topics")
                continue
            if not _path_known(path, k):
                yield f"unknown feed key `{path}` in a YAML block"
                continue
            yield from walk(value, path)

    yield from walk(doc, "")


def _event_problems(line: str, k: Known) -> Iterator[str]:
    for chain in EVENT_CHAIN.findall(line):
        for kind in re.findall(r"`([a-z0-9_]+)`", chain):
            if kind not in k.events:
                yield f"unknown event kind `{kind}`"


def problems_in(text: str, name: str) -> list[str]:
    """Every name in ``text`` (a Markdown file called ``name``) that the code does not have, as ``name:line: what``."""
    k = known()
    found: list[str] = []
    fence: str | None = None
    block: list[str] = []
    block_start = 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if fence is None:
                fence, block, block_start = stripped[3:].strip().lower(), [], number
            else:
                if fence in ("yaml", "yml"):
                    found.extend(f"{name}:{block_start}: {p}" for p in _yaml_problems("\n".join(block), k))
                fence = None
            continue
        if fence is not None:
            block.append(line)
            if fence in ("bash", "sh", "console", "shell", ""):
                problem = _check_command(stripped, k)
                if problem:
                    found.append(f"{name}:{number}: {problem}")
            continue
        found.extend(f"{name}:{number}: {p}" for p in _event_problems(line, k))
        for span in SPAN.findall(line):
            m = METRIC_EVENT.search(span)
            checks = [
                _check_command(span, k),
                _check_key(span, k),
                _check_dotted(span, k),
                _check_bare_flag(span, k, name),
                None if not m or m.group(1) in k.events else f"unknown event kind `{m.group(1)}`",
            ]
            found.extend(f"{name}:{number}: {p}" for p in checks if p)
    return found


def prose_files() -> list[Path]:
    """README.md and every Markdown page under ``docs/`` but the generated reference."""
    pages = sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.relative_to(ROOT / "docs").parts)
    return [ROOT / "README.md", *pages]


def problems() -> list[str]:
    return [p for path in prose_files() for p in problems_in(path.read_text(), str(path.relative_to(ROOT)))]


if __name__ == "__main__":
    print("\n".join(problems()) or "no drift")
