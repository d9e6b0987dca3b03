"""``make mutation``: generated mutants (mutmut) of the modules that decide what is shown, kept, deleted or masked.

Beside the hand-written mutants of :mod:`tests.mutants.run` (one breakage of a stated
guarantee each), mutmut writes every small mutation it knows into the listed modules (a
``<`` for a ``<=``, a ``+ 1`` for a ``- 1``, a string, a default, a removed call...) and
runs, for each, the tests of that module's own selection that reach the mutated function.
A mutant is *killed* when one of them fails (or it times out), *survived* when all pass,
*no tests* when none reaches it. Each module runs in a scratch copy of the working tree
(tracked and untracked files, as they are now) under ``.mutation/<module>/``, where the
package sits at ``src/tidemark`` (mutmut's layout; the tests import ``tidemark`` from the
mutated copy there): a second run reuses mutmut's results for the functions that did not
change.

    python -m tests.mutants.generated [MODULE ...] [--all] [--base REV] [--jobs N] [--doc]

``MODULE``: the modules to run (default: those not marked ``later``; ``--all`` adds
them). ``--base REV`` runs only the mutants on lines changed since ``REV`` (``git diff
REV``, the working tree included): ``make mutation-diff BASE=origin/main``. ``--jobs``:
mutmut's worker processes (default 2). ``--only GLOB`` (repeatable) runs only the mutants whose names match; the
others keep their last result (a module whose whole run does not fit the time there is). ``--doc`` writes the
summary into ``docs/faults.md`` ("Generated mutants"). The exit code is 1 when a module's killed share is
under :data:`TARGET` (a full run), or when any mutant on a changed line survived (``--base``).
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRATCH = ROOT / ".mutation"
DOC = ROOT / "docs" / "faults.md"
SECTION = "## Generated mutants"
TARGET = 0.85  # the share of generated mutants each module's tests must kill
PACKAGE = "include/tidemark/"

KILLED = {1: "killed", 3: "killed", 36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout"}
STATUS = {0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", None: "not checked", -9: "segfault",
          -11: "segfault", 37: "caught by type check"}  # fmt: skip


@dataclass(frozen=True)
class Module:
    name: str
    sources: tuple[str, ...]  # files under include/tidemark
    tests: tuple[str, ...]  # the module's fast selection: pytest files or node ids
    later: bool = False  # not in the default run (rewritten by others, or slow): run with --all or by name
    jobs: int | None = None  # mutmut's workers, when the tests cannot share a machine (a local Spark session)
    deselect: tuple[str, ...] = ()  # tests of the selection's files left out (a whole Spark application of their own)
    # Per test: a mutant making a test wait on the network (no CPU: mutmut's CPU limit never ends it) fails there.
    timeout_s: int | None = None
    # Mutants known to be equivalent (no test can tell them from the original), with the reason: counted killed.
    equivalent: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    # Survivors that are not equivalent and that no test of the selection kills yet, with why: counted survived.
    unkilled: dict[str, str] = field(default_factory=dict, hash=False, compare=False)


MODULES: tuple[Module, ...] = (
    Module(
        "masking-rules",
        ("include/tidemark/config/masking.py",),
        ("tests/unit/config/test_masking_config.py",),
        equivalent={
            "tidemark.config.masking.x_path_problem__mutmut_3": "`found` starts as '' instead of None: it is "
            "assigned before it is read (the first name is looked up in the declared schema, never None)",
            "tidemark.config.masking.x_path_problem__mutmut_9": "`here` becomes None only after a field was found, so "
            "`found` is set there and the `else '?'` branch cannot run",
            "tidemark.config.masking.x_path_problem__mutmut_10": "the `else '?'` branch cannot run (see mutmut_9)",
        },
    ),
    Module(
        "masking-spark",
        ("include/tidemark/spark/masking.py",),
        (
            "tests/unit/spark/test_masking_key.py",
            "tests/unit/spark/test_masking.py",
            "tests/unit/spark/test_masking_shapes.py",
        ),
        jobs=1,  # one local Spark session at a time on this machine
        later=True,  # its tests run Spark jobs: hours for its 723 mutants on 2 cores; run it by name
        deselect=("tests/unit/spark/test_masking.py::test_the_masking_key_reaches_no_plan_and_no_event_log",),
    ),
    Module("topics", ("include/tidemark/planning/topics.py",), ("tests/unit/planning/test_topics.py",)),
    Module(
        "lag",
        ("include/tidemark/orchestration/lag.py", "include/tidemark/orchestration/lag_trigger.py"),
        (
            "tests/unit/orchestration/test_lag_rule.py",
            "tests/unit/orchestration/test_lag_trigger_state.py",
            "tests/integration/orchestration/test_lag_probe.py",
        ),
        timeout_s=60,
        equivalent={
            "tidemark.orchestration.lag.x_decide__mutmut_15": "`last is not None and since_s is not None` to `or`: "
            "since_s is None exactly when last is None",
            "tidemark.orchestration.lag_trigger.xǁLagTriggerǁcheck__mutmut_19": "the second decide without the last "
            "firing: it runs only when the first, with it, fired, so the last firing held nothing back and both "
            "decide alike",
            "tidemark.orchestration.lag_trigger.xǁLagTriggerǁ_store__mutmut_5": "getattr without its default: "
            "Airflow's BaseEventTrigger always has asset_state_store (None outside a triggerer)",
            "tidemark.orchestration.lag.xǁLagProbeǁ_committed__mutmut_7": "enable.auto.commit True: the probe's "
            "consumer never subscribes, is assigned nothing and never polls, so it has nothing to commit",
        },
        unkilled={
            "tidemark.orchestration.lag.xǁLagProbeǁ_committed__mutmut_10": "the client.id shows only in the "
            "brokers' request logs and quotas, which no test reads",
            "tidemark.orchestration.lag.xǁLagProbeǁ_committed__mutmut_11": "the client.id (see mutmut_10)",
            "tidemark.orchestration.lag.xǁLagProbeǁ_committed__mutmut_16": "a socket timeout 10 ms longer",
            "tidemark.orchestration.lag.xǁLagProbeǁ_committed__mutmut_25": "OffsetFetch without its timeout differs "
            "only with a coordinator that does not answer (the fault suite's paused broker)",
            "tidemark.orchestration.lag.xǁLagProbeǁ_committed__mutmut_30": "the message of a failed OffsetFetch: "
            "needs a coordinator that fails it",
            "tidemark.orchestration.lag.xǁLagProbeǁ_committed__mutmut_31": "the message of a failed OffsetFetch",
            "tidemark.orchestration.lag.xǁLagProbeǁ_committed__mutmut_34": "the message of a partition's OffsetFetch "
            "error (an ACL refusing the group)",
            "tidemark.orchestration.lag.xǁLagProbeǁread__mutmut_31": "the timestamp look-up without the isolation "
            "differs only for an open transaction holding records older than the age",
        },
    ),
    Module(
        "partitioning",
        ("include/tidemark/output/partitioning.py",),
        ("tests/unit/output/test_partitioning.py", "tests/unit/output/test_partitioning_values.py"),
        jobs=1,  # the folder values' test runs Spark: one session at a time
        equivalent={
            "tidemark.output.partitioning.x_folder_value__mutmut_42": 'cast("STRING"): Spark reads type names '
            "case-insensitively, the same cast",
            "tidemark.output.partitioning.x_folder_value__mutmut_45": 'cast("STRING"): the same cast (see mutmut_42)',
        },
    ),
    Module(
        "protocol",
        ("include/tidemark/runs/protocol.py", "include/tidemark/runs/commit.py"),
        (
            "tests/unit/runs/test_protocol_model.py",
            "tests/unit/runs/test_committing_request.py",
            "tests/integration/runs/test_commit.py",
        ),
        later=True,  # its model tests take minutes a mutant on a loaded machine: run it by name (or with --only)
        equivalent={
            "tidemark.runs.protocol.x_abandon__mutmut_14": "asking the output about a plan without records: show "
            "promotes only plans with records, so it answers None as the skipped question does",
            "tidemark.runs.protocol.x_show__mutmut_1": "`manifest = None` instead of `already`: settle asks the "
            "output (`already`) only for a plan with records, and show returns `already` unchanged only for a plan "
            "without, where it is None",
            "tidemark.runs.protocol.x_settle_before_planning__mutmut_8": "the connection: settle always passes its "
            "adapter to commit_plan, which reads the connection only without one",
            "tidemark.runs.protocol.x_settle_before_planning__mutmut_15": "the connection left out (see mutmut_8)",
        },
    ),
    Module(
        "ledger",
        ("include/tidemark/output/ledger.py",),
        ("tests/unit/output/test_table_ledger.py",),
        equivalent={
            "tidemark.output.ledger.xǁLedgerǁend__mutmut_9": "the default of `current.get(topic, '')`: `current` "
            "names every topic `ends` has (with_plan sets both), so it is read only for a topic with no ends, where "
            "every id finds None",
            "tidemark.output.ledger.xǁLedgerǁend__mutmut_11": "the default of `current.get(topic, '')` (see mutmut_9)",
            "tidemark.output.ledger.xǁLedgerǁend__mutmut_12": "the default of `current.get(topic, '')` (see mutmut_9)",
            "tidemark.output.ledger.x_reconcile__mutmut_34": "the default of `current.get(topic, '')` in tid_of: "
            "read only for a topic the ledger has no ends of, whose keys are compared with no end",
            "tidemark.output.ledger.x_reconcile__mutmut_36": "the default in tid_of (see mutmut_34)",
            "tidemark.output.ledger.x_reconcile__mutmut_40": "the default in tid_of (see mutmut_34)",
            "tidemark.output.ledger.x_reconcile__mutmut_43": "a snapshot's ranges without its plan id: "
            "iceberg._facts gives ranges only with the feed's plan id (both from the same summary), else ()",
            "tidemark.output.ledger.x_reconcile__mutmut_72": "`detached.get(None)` for a plan without a snapshot id: "
            "`rolled` holds only plans with one",
        },
    ),
    Module("changes", ("include/tidemark/output/changes.py",), ("tests/unit/output/test_changes.py",), later=True),
    Module(
        "dead-letters",
        ("include/tidemark/output/dead_letter_table.py", "include/tidemark/output/deadletters.py"),
        ("tests/unit/output/test_dead_letter_table.py", "tests/unit/output/test_deadletters.py"),
        later=True,
        equivalent={
            **{
                f"tidemark.output.dead_letter_table.x_{name}__mutmut_{n}": "a scan's `limit=1` or `selected_fields` "
                "changed or left out: the scan reads more, its answer (any row; the set of names) is the same"
                for name, numbers in (
                    ("holds_plan", (5, 7, 8, 17)),
                    ("other_feeds", (8, 10, 11, 20)),
                    ("plans_in", (6,)),
                )
                for n in numbers
            },
            "tidemark.output.dead_letter_table.x_scan_rows__mutmut_12": "`since.astimezone(None)`: the machine's "
            "zone; only the day filter's date changes, and the day filter only prunes (the timestamp filter decides)",
            "tidemark.output.dead_letter_table.x_scan_rows__mutmut_18": "the day filter left out: it only prunes "
            "partitions, the timestamp filter decides which rows are listed",
            "tidemark.output.dead_letter_table.x_quarantine_files__mutmut_11": "a path part starting with X is left "
            "out too: a quarantine file's parts are topic=..., date=... and part-... (never an X)",
        },
        unkilled={
            "tidemark.output.dead_letter_table.x_file_rows__mutmut_3": "the file system of the quarantine file: "
            "a local path reads the same without it; an object store (the S3 integration tests) needs it",
            "tidemark.output.dead_letter_table.x_file_rows__mutmut_5": "the file system (see mutmut_3)",
        },
    ),
    Module(
        "redrive",
        ("include/tidemark/runs/redrive.py", "include/tidemark/job/redrive.py"),
        (
            "tests/unit/job/test_redrive_kept_raw.py",
            "tests/unit/job/test_redrive_refusals.py",
            "tests/unit/job/test_redrive_job.py",
        ),
        later=True,
    ),
    Module(
        "maintenance",
        ("include/tidemark/output/maintenance.py",),
        ("tests/integration/test_iceberg_maintenance.py",),
        later=True,
    ),
)


def copy_tree(target: Path) -> None:
    """The working tree as it is into ``target``, with ``include/tidemark`` at ``src/tidemark`` (mutmut's layout)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.is_file():
            continue
        dest = target / ("src/tidemark/" + name[len(PACKAGE) :] if name.startswith(PACKAGE) else name)
        if (
            dest.exists()
            and dest.stat().st_mtime == source.stat().st_mtime
            and dest.stat().st_size == source.stat().st_size
        ):
            continue  # unchanged: mutmut keeps its mutants of an unchanged file
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)
        if name.startswith(PACKAGE):
            # mutmut copies a source file it does not mutate only when its copy is missing: refresh it.
            (target / "mutants" / dest.relative_to(target)).unlink(missing_ok=True)


def _toml_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def configure(module: Module, target: Path) -> None:
    """mutmut's settings for ``module`` in the scratch copy's ``pyproject.toml`` (``[tool.mutmut]``)."""
    project = target / "pyproject.toml"
    deselect = [f"--deselect={t}" for t in module.deselect]
    if module.timeout_s is not None:
        deselect.append(f"--timeout={module.timeout_s}")
    text = (ROOT / "pyproject.toml").read_text()
    text += (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f"only_mutate = {_toml_list('src/tidemark/' + s[len(PACKAGE) :] for s in module.sources)}\n"
        f"pytest_add_cli_args = {_toml_list(['-p', 'no:cacheprovider', '-p', 'no:xdist', '-x', '-q', *deselect])}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(module.tests)}\n"
        'also_copy = ["dags", "spark_jobs", "plugins"]\n'
    )
    if not project.exists() or project.read_text() != text:
        project.write_text(text)


def mutants_meta(target: Path, source: str) -> dict[str, int | None]:
    meta = target / "mutants" / ("src/tidemark/" + source[len(PACKAGE) :] + ".meta")
    if not meta.exists():
        return {}
    data: dict[str, int | None] = json.loads(meta.read_text()).get("exit_code_by_key", {})
    return data


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function of a module by its mutmut name: ``x_name``, or ``xǁClassǁname`` for a method."""
    found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[f"x_{node.name}"] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    found[f"xǁ{node.name}ǁ{item.name}"] = item
    return found


def _copies(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """mutmut's copies of the functions in a mutated file, by their own names (methods' copies in their class)."""
    found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        for item in node.body if isinstance(node, ast.ClassDef) else [node]:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and "__mutmut_" in item.name:
                found[item.name] = item
    return found


def _body_lines(source: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, list[str]]:
    start = node.body[0].lineno
    if node.body[0].__dict__.get("decorator_list"):
        start = min(d.lineno for d in node.body[0].decorator_list)  # type: ignore[attr-defined]
    return start, source[start - 1 : node.end_lineno]


@dataclass
class Mutant:
    name: str
    source: str  # the file under include/tidemark
    status: str
    line: int | None  # in the source file
    before: str
    after: str


def describe(target: Path, source: str, codes: dict[str, int | None]) -> list[Mutant]:
    """Each mutant of ``source``: its status, the line of the original file it changes, that line before and after."""
    original = (ROOT / source).read_text().splitlines()
    originals = _functions(ast.parse("\n".join(original)))
    mutated_path = target / "mutants" / ("src/tidemark/" + source[len(PACKAGE) :])
    mutated = mutated_path.read_text().splitlines() if mutated_path.exists() else []
    copies = _copies(ast.parse("\n".join(mutated))) if mutated else {}
    out = []
    for name, code in sorted(codes.items()):
        status = KILLED.get(code, STATUS.get(code, "suspicious")) if code is not None else "not checked"  # type: ignore[arg-type]
        function = name.rsplit(".", 1)[-1]
        base, _, _ = function.partition("__mutmut_")
        line, before, after = None, "", ""
        orig_copy, mutant = copies.get(f"{base}__mutmut_orig"), copies.get(function)
        own = originals.get(base)
        if orig_copy is not None and mutant is not None and own is not None:
            _, a = _body_lines(mutated, orig_copy)
            _, b = _body_lines(mutated, mutant)
            start, _ = _body_lines(original, own)
            for k, (x, y) in enumerate(zip(a, b, strict=False)):
                if x != y:
                    line, before, after = start + k, x.strip(), y.strip()
                    break
            else:
                if len(a) != len(b):
                    k = min(len(a), len(b))
                    line = start + k
                    before = a[k].strip() if k < len(a) else ""
                    after = b[k].strip() if k < len(b) else ""
        out.append(Mutant(name, source, status, line, before, after))
    return out


def changed_lines(base: str, source: str) -> set[int]:
    """Lines of ``source`` (the working tree) that differ from ``base``."""
    diff = subprocess.run(["git", "diff", "-U0", base, "--", source], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout  # fmt: skip
    lines: set[int] = set()
    for match in re.finditer(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff, re.M):
        start, count = int(match.group(1)), int(match.group(2) or 1)
        lines.update(range(start, start + count))
    return lines


def mutmut(target: Path, names: list[str], jobs: int, log: Path) -> int:
    mutmut_bin = Path(sys.executable).with_name("mutmut")
    env = {**os.environ, "PYTHONPATH": ""}  # the mutated copy only (mutmut puts it first on the path)
    with log.open("a") as out:
        out.write(f"\n$ mutmut run {' '.join(names)} --max-children {jobs}\n")
        out.flush()
        return subprocess.run([str(mutmut_bin), "run", *names, "--max-children", str(jobs)], cwd=target, env=env,
                              stdout=out, stderr=subprocess.STDOUT, check=False).returncode  # fmt: skip


def generate(target: Path, log: Path) -> None:
    """mutmut's mutants of the configured files, without running any (for choosing those on changed lines)."""
    code = (
        "from mutmut.__main__ import copy_also_copy_files, copy_src_dir, create_mutants\n"
        "copy_src_dir(); copy_also_copy_files(); create_mutants(1)\n"
    )
    with log.open("a") as out:
        subprocess.run([sys.executable, "-c", code], cwd=target, stdout=out, stderr=subprocess.STDOUT, check=True)


def run_module(
    module: Module, base: str | None, jobs: int, run: bool = True, only: tuple[str, ...] = ()
) -> dict[str, object]:
    target = SCRATCH / module.name
    target.mkdir(parents=True, exist_ok=True)
    log = target / "mutation.log"
    started = time.monotonic()
    if not run:  # the results of the last run, as they are
        mutants = [m for s in module.sources for m in describe(target, s, mutants_meta(target, s))]
        for m in mutants:
            if m.status == "survived" and m.name in module.equivalent:
                m.status = "equivalent"
        return {"module": module.name, "sources": list(module.sources), "tests": list(module.tests),
                "mutmut_exit": None, "seconds": 0.0, "diff": None, "mutants": [vars(m) for m in mutants]}  # fmt: skip
    copy_tree(target)
    configure(module, target)
    log.write_text("")
    generate(target, log)  # mutmut keeps the results of the functions that did not change
    recorded = {k: v for source in module.sources for k, v in mutants_meta(target, source).items()}
    # The mutants not killed yet (new ones, survivors: tests may have been added since) run; the killed stand.
    names = [k for k, v in recorded.items() if v not in KILLED]
    if only:  # a part of a module whose whole run does not fit the time there is (the rest stays as last measured)
        names = [n for n in names if any(fnmatch.fnmatchcase(n, pattern) for pattern in only)]
    if base is not None:
        lines = {source: changed_lines(base, source) for source in module.sources}
        on = {
            m.name for s in module.sources for m in describe(target, s, mutants_meta(target, s)) if m.line in lines[s]
        }
        names = [n for n in names if n in on]
    code = mutmut(target, names, module.jobs or jobs, log) if names else 0
    # mutmut drops the results a change of the module's settings (its test selection) may have made stale: run those.
    stale = [k for source in module.sources for k, v in mutants_meta(target, source).items() if v is None]
    if only:
        stale = [n for n in stale if any(fnmatch.fnmatchcase(n, pattern) for pattern in only)]
    if base is not None:
        stale = [n for n in stale if n in on]
    if stale:
        code = mutmut(target, stale, module.jobs or jobs, log)
    mutants = [m for s in module.sources for m in describe(target, s, mutants_meta(target, s))]
    if base is not None:
        mutants = [m for m in mutants if m.name in on]
    for m in mutants:
        if m.status == "survived" and m.name in module.equivalent:
            m.status = "equivalent"
    return {
        "module": module.name,
        "sources": list(module.sources),
        "tests": list(module.tests),
        "mutmut_exit": code,
        "seconds": round(time.monotonic() - started, 1),
        "diff": base,
        "mutants": [vars(m) for m in mutants],
    }


def counts(result: dict[str, object]) -> dict[str, int]:
    mutants = result["mutants"]
    assert isinstance(mutants, list)
    c = {"generated": len(mutants), "killed": 0, "equivalent": 0, "survived": 0, "no tests": 0, "other": 0}
    for m in mutants:
        s = m["status"]
        key = "killed" if s in ("killed", "timeout") else s if s in c else "other"
        c[key] += 1
    return c


def share(c: dict[str, int]) -> float:
    return (c["killed"] + c["equivalent"]) / c["generated"] if c["generated"] else 1.0


def summary(results: list[dict[str, object]], module_names: dict[str, Module]) -> str:
    rows = [
        "| module | files | tests | generated | killed | equivalent | survived | no tests | killed share |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        c = counts(r)
        files = ", ".join(f"`{s[len(PACKAGE) :]}`" for s in r.get("sources", []))  # type: ignore[attr-defined]
        tests = ", ".join(f"`{t.rsplit('/', 1)[-1]}`" for t in r.get("tests", []))  # type: ignore[attr-defined]
        rows.append(f"| {r['module']} | {files} | {tests} | {c['generated']} | {c['killed']} | {c['equivalent']} | "
                    f"{c['survived']} | {c['no tests']} | {share(c):.0%} |")  # fmt: skip
    lines = ["\n".join(rows), ""]
    for r in results:
        module = module_names[str(r["module"])]
        left = [m for m in r["mutants"] if m["status"] not in ("killed", "timeout")]  # type: ignore[attr-defined]
        if not left:
            continue
        lines.append(f"**{r['module']}**, not killed:\n")
        for m in left:
            where = f"{m['source'][len(PACKAGE) :]}:{m['line']}"
            change = f"`{m['before']}` → `{m['after']}`" if m["before"] or m["after"] else "(see `mutmut show`)"
            why = module.equivalent.get(m["name"], "") or module.unkilled.get(m["name"], "")
            lines.append(f"- `{m['name']}` ({m['status']}) {where}: {change}{': ' + why if why else ''}")
        lines.append("")
    return "\n".join(lines)


def write_doc(text: str, command: str, measured: Iterable[str] = ()) -> None:
    others = [m.name for m in MODULES if m.name not in set(measured)]
    if others:
        text += (
            f"\nConfigured, not in this table (run by name: `make mutation MUTATION_ARGS='{' '.join(others)}'`): "
            + ", ".join(f"{m.name} ({', '.join(f'`{s[len(PACKAGE) :]}`' for s in m.sources)})" for m in MODULES
                        if m.name in others)
            + ".\n"
        )  # fmt: skip
    if "masking-spark" in others:
        text += (
            "Of masking-spark, the key's two functions were run alone (`mutmut run "
            "'tidemark.spark.masking.x_masking_key__mutmut_*' 'tidemark.spark.masking.x__hex_hmac__mutmut_*'` in its "
            "scratch copy): 33 generated, 33 killed. The rest (690) waits for a machine that can give a Spark "
            "session to each mutant.\n"
        )
    doc = DOC.read_text()
    head = doc.split(f"\n{SECTION}\n")[0].rstrip("\n")
    body = (
        f"\n\n{SECTION}\n\n"
        "Generated by `make mutation` (`tests/mutants/generated.py`, mutmut): every mutation mutmut knows, in the "
        "modules that decide what is shown, kept, deleted or masked, each run against its module's own fast test "
        "selection. *Killed*: a test of the selection failed (or the mutant hung past its timeout); *equivalent*: "
        "no test can tell it from the original (the reason is listed); the target is "
        f"{TARGET:.0%} killed in each module. Measured with `{command}` on the tree of this commit.\n\n"
        f"{text}\n"
    )
    DOC.write_text(head + body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("modules", nargs="*", help="modules to run (default: all not marked later)")
    parser.add_argument("--all", action="store_true", help="also the modules marked later")
    parser.add_argument("--base", help="only the mutants on lines changed since this git revision")
    parser.add_argument("--jobs", type=int, default=2, help="mutmut's worker processes (default 2)")
    parser.add_argument("--doc", action="store_true", help="write the summary into docs/faults.md")
    parser.add_argument("--only", action="append", default=[], metavar="GLOB", help="run only the mutants whose "
                        "names match (repeatable); the others keep their last result")  # fmt: skip
    parser.add_argument("--no-run", action="store_true", help="summarize the last run's results, running nothing")
    args = parser.parse_args(argv)
    by_name = {m.name: m for m in MODULES}
    unknown = set(args.modules) - set(by_name)
    if unknown:
        parser.error(f"no module named {sorted(unknown)}; known: {sorted(by_name)}")
    chosen = [by_name[n] for n in args.modules] if args.modules else [m for m in MODULES if args.all or not m.later]
    results = []
    for module in chosen:
        print(f"mutation: {module.name} ({', '.join(module.sources)}) ...", flush=True)
        result = run_module(module, args.base, args.jobs, run=not args.no_run, only=tuple(args.only))
        results.append(result)
        c = counts(result)
        print(f"mutation: {module.name}: {c['generated']} generated, {c['killed']} killed, {c['equivalent']} "
              f"equivalent, {c['survived']} survived, {c['no tests']} without tests ({share(c):.0%}), "
              f"{result['seconds']} s; log: {SCRATCH / module.name / 'mutation.log'}", flush=True)  # fmt: skip
    text = summary(results, by_name)
    print()
    print(text)
    SCRATCH.mkdir(exist_ok=True)
    (SCRATCH / "last-run.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    if args.doc and args.base is None:
        command = "python -m tests.mutants.generated " + " ".join(m.name for m in chosen)
        write_doc(text, command, [m.name for m in chosen])
        print(f"wrote {DOC}")
    if args.base is not None:
        left = [
            m["name"] for r in results for m in r["mutants"] if m["status"] not in ("killed", "timeout", "equivalent")
        ]  # type: ignore[attr-defined]
        return 1 if left else 0
    return 1 if any(share(counts(r)) < TARGET for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
