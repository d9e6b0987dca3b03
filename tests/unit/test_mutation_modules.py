"""``make mutation``'s module list names files that exist, and its figures count what they say."""

from __future__ import annotations

import pytest

from tests.mutants.generated import MODULES, ROOT, TARGET, counts, share


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.name)
def test_each_module_names_existing_sources_and_tests(module) -> None:  # type: ignore[no-untyped-def]
    for source in module.sources:
        assert source.startswith("include/tidemark/") and (ROOT / source).is_file(), source
    for test in (*module.tests, *module.deselect):
        assert (ROOT / test.split("::")[0]).is_file(), test
    for name in {**module.equivalent, **module.unkilled}:
        assert name.split(".x")[0].replace(".", "/") in " ".join(s[len("include/") : -3] for s in module.sources)


def test_killed_share_counts_timeouts_and_equivalents_as_killed_and_untested_ones_against() -> None:
    statuses = ["killed"] * 80 + ["timeout"] * 3 + ["equivalent"] * 2 + ["survived"] * 10 + ["no tests"] * 5
    c = counts({"mutants": [{"status": s} for s in statuses]})
    assert c == {"generated": 100, "killed": 83, "equivalent": 2, "survived": 10, "no tests": 5, "other": 0}
    assert share(c) == 0.85 and share(c) >= TARGET
    c["killed"] -= 1
    assert share(c) < TARGET  # one short of the target
    assert share(counts({"mutants": []})) == 1.0
