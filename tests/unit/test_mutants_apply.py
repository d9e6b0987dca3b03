"""Every mutant of ``make mutants`` still applies to today's code and names tests that exist.

The runner refuses a mutant whose text is not found exactly once, but only when someone
runs ``make mutants``: a refactor that moves the guarded line leaves the mutant silently
stale until then. This checks, on every ``make test``, that each edit's text occurs once
in its file and that each named test's file defines the test function.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.mutants.run import MUTANTS, ROOT


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutant_applies_once_and_names_existing_tests(mutant) -> None:  # type: ignore[no-untyped-def]
    for edit in mutant.edits:
        text = (ROOT / edit.path).read_text()
        assert text.count(edit.old) == 1, f"{mutant.name}: {edit.path} holds its text {text.count(edit.old)} times"
    for node in mutant.tests:
        path, _, name = node.partition("::")
        source = Path(ROOT / path).read_text()  # a whole file, or the file of the named test
        if not name:
            continue
        function = re.sub(r"\[.*\]$", "", name.split("::")[-1])
        assert re.search(rf"^\s*(async )?def {re.escape(function)}\(", source, re.M), f"{mutant.name}: no {node}"
