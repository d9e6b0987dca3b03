"""``make mutants`` counts a mutant caught only when a test fails on an assertion.

A product exception that escapes a test's body (a ``StuckRunError`` out of a helper, an
``assert`` inside ``tidemark``) says the code broke, not that the test saw the guarantee
broken: it is listed apart, as an errored fixture is. Checked on the JUnit XML that pytest
itself writes for tests that end each way, read by the runner's own :func:`read_report`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.mutants.run import ROOT, Outcome, classify, read_report, table

SAMPLE = """
import importlib.util
import pathlib

import pytest

from tidemark.errors import StuckRunError


def settle_like_a_fixture():
    raise StuckRunError("run 0001-a of feed 'f' cannot be finished")


def product_assert():
    path = pathlib.Path(__file__).parent / "include" / "tidemark" / "checked.py"
    spec = importlib.util.spec_from_file_location("checked", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.check(None)


def test_assert_fails():
    assert 1 + 1 == 3


def test_assertion_error_raised_by_the_test():
    raise AssertionError("the output holds offset 4 twice")


def test_fail_called():
    pytest.fail("offset 4 shown twice")


def test_raises_saw_nothing():
    with pytest.raises(StuckRunError):
        pass


def test_raises_wrong_message():
    with pytest.raises(StuckRunError, match="abandon"):
        settle_like_a_fixture()


def test_product_exception_in_the_body():
    settle_like_a_fixture()


def test_product_exception_asserted():
    with pytest.raises(StuckRunError):
        settle_like_a_fixture()


def test_key_error_in_the_body():
    {}["missing"]


def test_assert_inside_the_product():
    product_assert()


@pytest.fixture
def broken():
    raise StuckRunError("the fixture's run is stuck")


def test_fixture_errors(broken):
    pass


def test_passes():
    assert True
"""


def test_only_assertions_of_the_test_count_as_caught(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    product = tmp_path / "include" / "tidemark"
    product.mkdir(parents=True)
    (product / "checked.py").write_text("def check(key):\n    assert key is not None\n    return key\n")
    report = tmp_path / "junit.xml"
    env_path = f"{ROOT / 'include'}"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={report}",
         "test_sample.py"],
        cwd=tmp_path, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, check=False, capture_output=True,
    )  # fmt: skip
    red, passed, errored, raised = read_report(report)
    names = lambda ids: sorted(i.split("::")[-1] for i in ids)  # noqa: E731
    assert names(red) == [
        "test_assert_fails", "test_assertion_error_raised_by_the_test", "test_fail_called",
        "test_raises_saw_nothing", "test_raises_wrong_message",
    ]  # fmt: skip
    assert names(raised) == [
        "test_assert_inside_the_product",
        "test_key_error_in_the_body",
        "test_product_exception_in_the_body",
    ]
    assert names(errored) == ["test_fixture_errors"]
    assert names(passed) == ["test_passes", "test_product_exception_asserted"]


def test_a_mutant_whose_tests_only_raised_is_not_caught_and_the_table_says_why() -> None:
    raised = Outcome("m", "a guarantee", ["t.py::test_a"], red=[], passed=[], raised=["t.py::test_a"])
    assert not raised.caught
    row = table([raised]).splitlines()[-1]
    assert "`t.py::test_a` (raised)" in row and "NO (survived)" in row
    asserted = Outcome("m", "a guarantee", ["t.py::test_a", "t.py::test_b"], red=["t.py::test_b"], passed=[],
                       raised=["t.py::test_a"])  # fmt: skip
    assert asserted.caught


def test_classify_reads_the_failures_first_line_and_innermost_frame() -> None:
    assert classify("assert 2 == 3", "tests/unit/x.py:4: AssertionError") == "assertion"
    assert classify("AssertionError: shown twice", "tests/unit/x.py:4: AssertionError") == "assertion"
    assert classify("Failed: DID NOT RAISE <class 'X'>", "tests/unit/x.py:9: Failed") == "assertion"
    assert classify("Failed: Timeout (>90.0s) from pytest-timeout.", "include/tidemark/spark/source.py:1: Failed") == (
        "assertion"
    )
    assert classify("tidemark.errors.StuckRunError: run 1", "tests/unit/x.py:3: StuckRunError") == "raised"
    assert classify("AssertionError", "include/tidemark/spark/masking.py:210: AssertionError") == "raised"
    assert classify("", "") == "raised"
