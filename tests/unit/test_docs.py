"""The docs cannot drift from the code: the generated reference is current, and prose names only what exists.

The reference pages under ``docs/reference/`` are what :mod:`tests.support.docs_reference` writes from the code
(``make docs``); the prose (README.md, the other pages under ``docs/``) may name feed keys, CLI commands and flags,
and event kinds only as :mod:`tests.support.docs_drift` defines, and each named must exist. Each drift rule is
checked on a planted mistake, so a rule that stopped matching would show here.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from tests.support import docs_drift, docs_reference
from tidemark.config.models import Feed
from tidemark.orchestration import metrics
from tidemark.planning.plan import EventKind


def test_every_committed_reference_page_is_what_the_code_generates() -> None:
    stale = [
        name
        for name, text in docs_reference.generate().items()
        if not (docs_reference.REFERENCE / name).exists() or (docs_reference.REFERENCE / name).read_text() != text
    ]
    assert stale == [], f"docs/reference/ is stale ({', '.join(stale)}): run `make docs` and commit the result"


def test_the_tree_names_no_feed_key_flag_or_event_the_code_lacks() -> None:
    assert docs_drift.problems() == []


def test_the_readme_starts_short() -> None:
    assert len((docs_reference.ROOT / "README.md").read_text().splitlines()) <= 300


@pytest.mark.parametrize(
    ("prose", "problem"),
    [
        # feed keys: a key with its colon, a dotted path, a value outside the key's set, a YAML block's key
        ("Set `on_missng:` to choose.", "unknown feed key `on_missng`"),
        ("Set `masking.keep_rawx` to keep them.", "unknown feed key `masking.keep_rawx`"),
        ("With `iceberg.mode: merge` the table ...", "`iceberg.mode` takes append, upsert, not `merge`"),
        ("```yaml\ntopics: [orders]\nvalidation:\n  on_bad_record: quarantine\n```", "unknown feed key "
         "`validation.on_bad_record` in a YAML block"),
        ("```yaml\ntopics: [orders]\nretries: 3\n```", "unknown feed key `retries` in a YAML block"),
        # CLI: an unknown command, an unknown flag inline or in a shell block, a bare unknown flag
        ("Run `tidemark replay-all orders`.", "unknown command `tidemark replay-all`"),
        ("Run `tidemark redrive orders --since 2026-01-01 --purge-all`.", "`tidemark redrive` has no flag "
         "`--purge-all`"),
        ("```bash\n.venv/bin/tidemark backfill orders --from 2026-11-01\n```", "`tidemark backfill` has no flag "
         "`--from`"),
        ("Add `--force-commit` to skip the check.", "no `tidemark` command has the flag `--force-commit`"),
        # event kinds: named as an event, in a chain, as a metric
        ("the run's `order_lost` event says so", "unknown event kind `order_lost`"),
        ("`topic_added` / `topic_gone` events", "unknown event kind `topic_gone`"),
        ("counted as `tidemark.event.quarantined`", "unknown event kind `quarantined`"),
    ],
)  # fmt: skip
def test_a_planted_mistake_is_named_with_its_line(prose: str, problem: str) -> None:
    found = docs_drift.problems_in(f"# Page\n\n{prose}\n", "docs/page.md")
    line = 4 if prose.startswith("```bash") else 3  # a command's own line; a YAML block's first
    assert found == [f"docs/page.md:{line}: {problem}"]


@pytest.mark.parametrize(
    "prose",
    [
        "Set `on_missing:` to `timestamp`; `iceberg.mode: upsert` keys the table; `masking.fields.customer.email`.",
        "A report's `records: 0` and `reason: checkpoint` are fields, not feed keys; so is `trigger.json`.",
        "`validation.rules.validate` is a function; `iceberg.before_commit` a fault point.",
        "Run `tidemark --kafka-log warning status orders` or `tidemark kafka up`; add `--dry-run`.",
        "```bash\n$ tidemark redrive orders --dry-run\n"
        "TIDEMARK_BOOTSTRAP_SERVERS=b:9093 .venv/bin/tidemark status orders\n```",
        "a `data_loss` or `group_offsets_expired` event; `event.data_loss`; spark-submit's `--conf`.",
        "```yaml\ntopics:\n  pattern: 'orders\\..*'\niceberg:\n  partition_by: {field: placed_at, granularity: day}\n"
        "masking:\n  fields: {customer.email: hash}\n```",
    ],
)
def test_what_exists_passes(prose: str) -> None:
    assert docs_drift.problems_in(prose, "docs/page.md") == []


def test_the_feed_reference_lists_every_key_with_a_real_error() -> None:
    keys = {k.path for k in docs_reference.feed_keys()}
    assert set(Feed.model_fields) - {"name", "topic_pattern"} <= keys
    assert {"topics.pattern", "iceberg.mode", "masking.keep_raw", "validation.expectations[].type"} <= keys
    on_missing = next(k for k in docs_reference.feed_keys() if k.path == "on_missing")
    assert docs_reference.error_for(on_missing) == (
        "'not-a-valid-value': field 'on_missing': Input should be 'earliest', 'latest', 'timestamp' or 'fail'"
    )


def test_the_cli_reference_has_every_command_and_flag() -> None:
    page = docs_reference.cli_page()
    for command in docs_reference.commands():
        assert f"## `{' '.join(('tidemark', *command.words))}`" in page
        for flag in docs_reference.flags(command.parser):
            assert f"`{flag}`" in page


def test_every_event_kind_has_a_meaning() -> None:
    kinds = docs_reference.event_kinds()
    assert set(kinds) == set(EventKind.__args__)
    assert [kind for kind, meaning in kinds.items() if not meaning] == []


def test_every_metric_the_functions_send_is_declared() -> None:
    """Each ``f"{PREFIX}.name"`` in ``orchestration/metrics.py`` (and the names its loops send) has an entry."""
    source = Path(metrics.__file__).read_text()
    sent = set(re.findall(r'f"\{PREFIX\}\.([a-z_.]+)', source))
    tree = ast.parse(source)
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For) and isinstance(n.iter, ast.Tuple)]
    sent |= {e.value for loop in loops for e in loop.iter.elts if isinstance(e, ast.Constant)}  # records_read, ...
    declared = [m.name for m in metrics.METRICS]
    missing = [s for s in sent if not any(d == s or (s.endswith(".") and d.startswith(s)) for d in declared)]
    assert missing == []
    assert {"event.<kind>", "step.<step>", "run.committed", "run.not_committed", "records_read"} <= set(declared)


def test_the_layer_table_names_every_module_and_the_contracts_layers() -> None:
    """docs/ARCHITECTURE.md's layer table: each subpackage's row names each of its modules, and the layer diagram
    lists every layer of the import-linter contract (pyproject.toml), core leaves included."""
    text = (docs_reference.ROOT / "docs" / "ARCHITECTURE.md").read_text()
    package = docs_reference.ROOT / "include" / "tidemark"
    unnamed = []
    for folder in sorted(p for p in package.iterdir() if (p / "__init__.py").exists()):
        row = next((line for line in text.splitlines() if line.startswith(f"| `{folder.name}` |")), "")
        unnamed += [f"{folder.name}.{m.stem}" for m in sorted(folder.glob("*.py"))
                    if not m.stem.startswith("__") and m.stem not in row]  # fmt: skip
    assert unnamed == [], "docs/ARCHITECTURE.md's layer table does not name these modules"
    contract = tomllib.loads((docs_reference.ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in contract["contracts"] if c["name"] == "Lower layers never import higher ones")["layers"]
    diagram = text[text.index("## Layers") : text.index("| layer | owns |")]
    for layer in layers:
        assert " ".join(layer.replace("|", " | ").replace(":", " : ").split()) in " ".join(diagram.split()), layer


def test_every_kind_the_library_reports_is_an_event_kind() -> None:
    """The event reference comes from ``EventKind``: an event the library writes by another kind (a report's dict,
    ``kind="..."``) would be missing from it. The view's own "quarantined" row of its events table is no event."""
    package = docs_reference.ROOT / "include" / "tidemark"
    written = {
        (path.relative_to(package).as_posix(), kind)
        for path in package.rglob("*.py")
        for line in path.read_text().splitlines()
        if "np." not in line  # numpy's sort and search kinds (kind="stable") are no events
        for kind in re.findall(r'(?:kind=|"kind": )"([a-z_]+)"', line)
    }
    assert {kind for where, kind in written if where != "web/app.py"} - set(EventKind.__args__) == set()
    assert len(written) > 5  # the pattern still finds the library's events
