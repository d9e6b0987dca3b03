"""No import cycles in the package: none among the modules of one subpackage, none across them.

The layers contract (``pyproject.toml``, ``make lint``) sees imports between subpackages
only, and import-linter's ``acyclic_siblings`` contract squashes each package into its
children, so a cycle that runs through a package's own ``__init__`` (``tidemark.cli`` →
``tidemark.cli.plan`` → ``tidemark.cli``) escapes both. This test builds the whole module
graph with grimp, imports inside functions included (grimp reads every import statement),
finds every strongly connected component and names one cycle of each, with the import
lines that close it. ``make lint`` runs it beside import-linter.
"""

from __future__ import annotations

from collections import deque
from functools import cache
from pathlib import Path

import grimp
import pytest

import tidemark

ROOT = "tidemark"
SUBPACKAGES = sorted(p.parent.name for p in Path(tidemark.__file__).parent.glob("*/__init__.py"))


@cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(ROOT, cache_dir=None)


def _components(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (each holds at least one cycle)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative: the graph's depth is not bounded
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(edges[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in modules:
        if module not in index:
            visit(module)
    return found


def _one_cycle(graph: grimp.ImportGraph, component: list[str]) -> str:
    """The shortest cycle through the component's first module, each step with its import line."""
    members = set(component)
    first = component[0]
    came_from: dict[str, str] = {}
    queue = deque([first])
    while queue:
        node = queue.popleft()
        for target in sorted(graph.find_modules_directly_imported_by(node) & members):
            if target == first:
                path = [node]
                while path[-1] != first:
                    path.append(came_from[path[-1]])
                path.reverse()
                steps = zip(path, [*path[1:], first], strict=True)
                return "\n".join(_step(graph, importer, imported) for importer, imported in steps)
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"no cycle through {first} in {component}")  # a component always has one


def _step(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    where = f" (line {details[0]['line_number']}: {details[0]['line_contents']})" if details else ""
    return f"  {importer} -> {imported}{where}"


def _home(component: list[str]) -> str | None:
    """The subpackage every module of the component sits in; None when it spans several (or the root)."""
    homes = {m.split(".")[1] if m.count(".") >= 1 and m.split(".")[1] in SUBPACKAGES else None for m in component}
    return homes.pop() if len(homes) == 1 else None


def _cycles(home: str | None) -> list[str]:
    graph = _graph()
    return [
        f"{len(c)} modules import each other: {', '.join(c)}\n{_one_cycle(graph, c)}"
        for c in _components(graph)
        if _home(c) == home
    ]


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_no_import_cycle_inside_a_subpackage(subpackage: str) -> None:
    cycles = _cycles(subpackage)
    assert not cycles, f"import cycles inside tidemark.{subpackage}:\n" + "\n".join(cycles)


def test_no_import_cycle_across_the_package() -> None:
    cycles = _cycles(None)
    assert not cycles, "import cycles across tidemark's subpackages:\n" + "\n".join(cycles)


def test_the_check_names_a_cycle_through_a_package_init() -> None:
    """The check itself: a cycle through a package's ``__init__`` (the one the cli had) is found and named."""
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.cli", "pkg.cli.plan", "pkg.cli.output"):
        graph.add_module(module)
    graph.add_import(
        importer="pkg.cli", imported="pkg.cli.plan", line_number=3, line_contents="from pkg.cli.plan import x"
    )
    graph.add_import(
        importer="pkg.cli.plan", imported="pkg.cli", line_number=9, line_contents="from pkg.cli import table"
    )
    graph.add_import(importer="pkg.cli.plan", imported="pkg.cli.output")

    components = _components(graph)

    assert components == [["pkg.cli", "pkg.cli.plan"]]
    assert _one_cycle(graph, components[0]) == (
        "  pkg.cli -> pkg.cli.plan (line 3: from pkg.cli.plan import x)\n"
        "  pkg.cli.plan -> pkg.cli (line 9: from pkg.cli import table)"
    )


def test_the_cli_output_helpers_are_a_leaf_of_the_cli() -> None:
    """Every command module prints through ``tidemark.cli.output``; it imports no other cli module, so none cycles."""
    graph = _graph()
    imported = graph.find_modules_directly_imported_by("tidemark.cli.output")
    assert not {m for m in imported if m == "tidemark.cli" or m.startswith("tidemark.cli.")}, imported
    importers = graph.find_modules_that_directly_import("tidemark.cli.output")
    commands = {"tidemark.cli", "tidemark.cli.plan", "tidemark.cli.run", "tidemark.cli.runs", "tidemark.cli.demo"}
    assert commands <= importers, importers
