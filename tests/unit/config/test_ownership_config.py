"""Every byte has one owner: feeds whose paths, tables or groups overlap are refused at load, naming both files.

Each refused case sits beside its case one step outside the boundary (a sibling name that
merely shares a prefix, a group that differs by one character), which loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.config.models import load_feed, load_feeds, package_root, scan_feeds
from tidemark.config.ownership import Claim, clash, path_relation
from tidemark.errors import ConfigError

ICEBERG = "output_format: iceberg\n"


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(path))
    return path


def feed(group: str, extra: str = "") -> str:
    return f"topics: [orders]\ngroup: {group}\n{extra}"


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


# (id, first feed (name, text), second feed (name, text), the fields the refusal names); {o} is a scratch folder.
REFUSED = [
    (
        "same-output",
        ("a", feed("ga", "output: {o}/orders\n")),
        ("b", feed("gb", "output: {o}/orders\n")),
        ["output {o}/orders of 'a' is output {o}/orders of 'b'"],
    ),
    (
        "output-inside-output",
        ("a", feed("ga", "output: {o}/orders\n")),
        ("b", feed("gb", "output: {o}/orders/eu\n")),
        ["output {o}/orders of 'a' contains output {o}/orders/eu of 'b'"],
    ),
    (
        "output-holding-output",
        ("a", feed("ga", "output: {o}/orders\n")),
        ("b", feed("gb", "output: {o}\n")),
        ["output {o}/orders of 'a' lies inside output {o} of 'b'"],
    ),
    (
        "parquet-inside-iceberg-table",
        ("a", feed("ga", ICEBERG + "output: {o}/orders\n")),
        ("b", feed("gb", "output: {o}/orders/data/pq\n")),
        ["contains output {o}/orders/data/pq of 'b'"],
    ),
    (
        "default-name-on-pending",
        ("x", feed("gx", ICEBERG)),
        ("x.pending", feed("gy")),
        [
            "the output (default)'s sibling {s}/output/x.pending of 'x'",
            "output (default) {s}/output/x.pending of 'x.pending'",
        ],
    ),
    (
        "default-name-on-dead-letters",
        ("orders", feed("ga", ICEBERG)),
        ("orders.dead_letters", feed("gb", ICEBERG)),
        [
            "both own Iceberg table tidemark.orders_dead_letters",
            "iceberg.dead_letters (default) of 'orders'",
            "iceberg.table (default) of 'orders.dead_letters'",
            "sibling {s}/output/orders.dead_letters of 'orders'",
        ],
    ),
    ("default-name-on-replays", ("orders", feed("ga")), ("orders.replays", feed("gb")), ["orders.replays"]),
    (
        "quarantine-in-other-output",
        ("a", feed("ga", "output: {o}/orders\n")),
        ("b", feed("gb", ICEBERG + "output: {o}/b\niceberg: {{quarantine: {o}/orders/q}}\n")),
        ["contains iceberg.quarantine {o}/orders/q of 'b'"],
    ),
    (
        "keep-raw-on-other-quarantine",
        ("a", feed("ga", ICEBERG + "output: {o}/orders\n")),
        ("b", feed("gb", "output: {o}/b\nmasking: {{key: hash, keep_raw: {o}/orders.quarantine}}\n")),
        ["sibling {o}/orders.quarantine of 'a' is masking.keep_raw {o}/orders.quarantine of 'b'"],
    ),
    (
        "same-table",
        ("a", feed("ga", ICEBERG + "output: {o}/a\niceberg: {{table: lake.orders}}\n")),
        ("b", feed("gb", ICEBERG + "output: {o}/b\niceberg: {{table: lake.Orders}}\n")),
        ["both own Iceberg table lake.orders (iceberg.table of 'a', iceberg.table of 'b')"],
    ),
    (
        "table-is-other-dead-letters",
        ("a", feed("ga", ICEBERG + "output: {o}/a\niceberg: {{dead_letters: lake.bad}}\n")),
        ("b", feed("gb", ICEBERG + "output: {o}/b\niceberg: {{table: lake.bad}}\n")),
        ["Iceberg table lake.bad (iceberg.dead_letters of 'a', iceberg.table of 'b')"],
    ),
    (
        "same-group",
        ("a", feed("orders-batch", "output: {o}/a\n")),
        ("b", feed("orders-batch", "output: {o}/b\n")),
        ["both read with consumer group 'orders-batch' (field 'group')"],
    ),
]
# The same pairs one step outside: each loads.
ALLOWED = [
    (
        "sibling-output-sharing-a-prefix",
        ("a", feed("ga", "output: {o}/orders\n")),
        ("b", feed("gb", "output: {o}/orders2\n")),
    ),
    ("name-next-to-pending", ("x", feed("gx", ICEBERG)), ("x.pending2", feed("gy"))),
    ("name-next-to-dead-letters", ("orders", feed("ga", ICEBERG)), ("orders.dead_letter", feed("gb", ICEBERG))),
    (
        "quarantine-beside-other-output",
        ("a", feed("ga", "output: {o}/orders\n")),
        ("b", feed("gb", ICEBERG + "output: {o}/b\niceberg: {{quarantine: {o}/orders2/q}}\n")),
    ),
    (
        "keep-raw-beside-other-quarantine",
        ("a", feed("ga", ICEBERG + "output: {o}/orders\n")),
        ("b", feed("gb", "output: {o}/b\nmasking: {{key: hash, keep_raw: {o}/orders.quarantine2}}\n")),
    ),
    (
        "table-sharing-a-prefix",
        ("a", feed("ga", ICEBERG + "output: {o}/a\niceberg: {{table: lake.orders}}\n")),
        ("b", feed("gb", ICEBERG + "output: {o}/b\niceberg: {{table: lake.orders2}}\n")),
    ),
    (
        "group-one-character-longer",
        ("a", feed("orders-batch", "output: {o}/a\n")),
        ("b", feed("orders-batch2", "output: {o}/b\n")),
    ),
    (
        "group-differing-in-case",
        ("a", feed("orders-batch", "output: {o}/a\n")),
        ("b", feed("Orders-batch", "output: {o}/b\n")),
    ),
]


def _fill(text: str, tmp_path: Path, state: Path) -> str:
    return text.format(o=tmp_path / "out", s=state)


@pytest.mark.parametrize(("first", "second", "fields"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_feeds_that_overlap_are_refused_at_load_naming_both_files_and_the_fields(
    tmp_path: Path, state: Path, first: tuple[str, str], second: tuple[str, str], fields: list[str]
) -> None:
    folder = tmp_path / "feeds"
    a = write(folder, first[0], _fill(first[1], tmp_path, state))
    b = write(folder, second[0], _fill(second[1], tmp_path, state))
    write(folder, "bystander", feed("g-bystander", f"output: {tmp_path / 'elsewhere'}\n"))

    scan = scan_feeds(folder)

    assert list(scan.feeds) == ["bystander"]  # every other feed loads
    problems = {p.name: p for p in scan.problems}
    assert sorted(problems) == sorted([first[0], second[0]])
    for problem in problems.values():
        assert set(problem.files) == {str(a), str(b)}
        assert f"feed file {a}" in problem.error and f"feed file {b}" in problem.error
        for text in fields:
            assert _fill(text, tmp_path, state) in problem.error
    for name in (first[0], second[0]):  # the CLI's and the tasks' load of either one is refused too
        with pytest.raises(ConfigError, match=r"overlap|both") as refused:
            load_feed(name, folder)
        assert str(a) in str(refused.value) and str(b) in str(refused.value)
    with pytest.raises(ConfigError):
        load_feeds(folder)


@pytest.mark.parametrize(("first", "second"), [c[1:] for c in ALLOWED], ids=[c[0] for c in ALLOWED])
def test_feeds_one_step_apart_load(
    tmp_path: Path, state: Path, first: tuple[str, str], second: tuple[str, str]
) -> None:
    folder = tmp_path / "feeds"
    write(folder, first[0], _fill(first[1], tmp_path, state))
    write(folder, second[0], _fill(second[1], tmp_path, state))

    scan = scan_feeds(folder)

    assert scan.problems == ()
    assert sorted(scan.feeds) == sorted([first[0], second[0]])
    assert load_feed(second[0], folder).name == second[0]


OWN = [
    (
        "quarantine-in-own-table",
        ICEBERG + "output: {o}/orders\niceberg: {{quarantine: {o}/orders/q}}\n",
        "output {o}/orders of 'orders' contains iceberg.quarantine {o}/orders/q of 'orders'",
    ),
    (
        "quarantine-on-own-dead-letters",
        ICEBERG + "output: {o}/orders\niceberg: {{quarantine: {o}/orders.dead_letters}}\n",
        "iceberg.quarantine {o}/orders.dead_letters of 'orders'",
    ),
    (
        "quarantine-on-own-pending",
        ICEBERG + "output: {o}/orders\niceberg: {{quarantine: {o}/orders.pending/q}}\n",
        "the output's sibling {o}/orders.pending of 'orders' contains iceberg.quarantine {o}/orders.pending/q",
    ),
    (
        "keep-raw-is-own-quarantine",
        ICEBERG + "output: {o}/orders\niceberg: {{quarantine: {o}/q}}\nmasking: {{key: hash, keep_raw: {o}/q}}\n",
        "iceberg.quarantine {o}/q of 'orders' is masking.keep_raw {o}/q of 'orders'",
    ),
]
OWN_ALLOWED = [
    ("quarantine-beside-own-table", ICEBERG + "output: {o}/orders\niceberg: {{quarantine: {o}/orders2/q}}\n"),
    (
        "quarantine-beside-own-dead-letters",
        ICEBERG + "output: {o}/orders\niceberg: {{quarantine: {o}/orders.dead_letters2}}\n",
    ),
    (
        "keep-raw-beside-own-quarantine",
        ICEBERG + "output: {o}/orders\niceberg: {{quarantine: {o}/q}}\nmasking: {{key: hash, keep_raw: {o}/q2}}\n",
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in OWN], ids=[c[0] for c in OWN])
def test_a_feed_whose_own_paths_overlap_is_refused_naming_its_file_and_fields(
    tmp_path: Path, state: Path, text: str, expected: str
) -> None:
    path = write(tmp_path / "feeds", "orders", feed("g", _fill(text, tmp_path, state)))
    with pytest.raises(ConfigError) as refused:
        load_feed("orders", tmp_path / "feeds")
    assert str(path) in str(refused.value)
    assert _fill(expected, tmp_path, state) in str(refused.value)


@pytest.mark.parametrize("text", [c[1] for c in OWN_ALLOWED], ids=[c[0] for c in OWN_ALLOWED])
def test_a_feed_whose_own_paths_are_one_step_apart_loads(tmp_path: Path, state: Path, text: str) -> None:
    write(tmp_path / "feeds", "orders", feed("g", _fill(text, tmp_path, state)))
    assert load_feed("orders", tmp_path / "feeds").name == "orders"


@pytest.mark.parametrize(
    ("output", "refused"),
    [
        ("{s}", True),  # the state dir itself
        ("{s}/..", True),  # holds it
        ("{s}/runs", True),
        ("{s}/runs/orders", True),
        ("{s}/maintenance/orders", True),
        ("{s}/output", True),  # the parent of every default output
        ("{s}/runs2", False),
        ("{s}/output/orders", False),  # the default place, named
        ("{s}2", False),
    ],
)
def test_a_feed_path_in_the_state_dirs_entries_is_refused(
    tmp_path: Path, state: Path, output: str, refused: bool
) -> None:
    folder = tmp_path / "feeds"
    path = write(folder, "orders", feed("g", f"output: {output.format(s=state)}\n"))
    scan = scan_feeds(folder)
    assert [p.name for p in scan.problems] == (["orders"] if refused else [])
    if refused:
        assert str(path) in scan.problems[0].error and "state dir" in scan.problems[0].error
        with pytest.raises(ConfigError, match="state dir"):
            load_feed("orders", folder)


def test_the_projects_own_feeds_load_together() -> None:
    scan = scan_feeds(package_root() / "feeds")
    assert scan.problems == () and sorted(scan.feeds) == ["demo", "demo_avro"]


@pytest.mark.parametrize(
    ("a", "b", "how"),
    [
        ("/o/orders", "/o/orders", "is"),
        ("/o/orders/x", "/o/orders", "lies inside"),
        ("/o", "/o/orders", "contains"),
        ("/o/orders2", "/o/orders", None),
        ("/o/orders", "/o/orders2", None),
        ("/o/orders.pending", "/o/orders", None),
        ("s3://b/orders", "s3://b/orders/x", "contains"),
        ("s3://b/orders", "s3://b2/orders", None),
    ],
)
def test_path_relation_boundaries(a: str, b: str, how: str | None) -> None:
    assert path_relation(a, b) == how


def test_claims_of_different_kinds_never_clash() -> None:
    assert clash(Claim("a", "group", "group", "x"), Claim("b", "iceberg.table", "table", "x")) is None
