"""The one redaction every writer uses: texts, nested documents, URL passwords."""

from __future__ import annotations

from tidemark.redaction import REDACTED, password_forms, redact, redact_url, replace_everywhere


def test_redact_walks_texts_keys_and_lists_and_takes_the_longest_secret_whole() -> None:
    doc = {"error": "login as admin:hunter2-long failed", "hunter2": ["x hunter2 y", ("hunter2",)], "n": 3}

    shown = redact(doc, ["hunter2", "hunter2-long", None, ""])

    assert shown == {"error": f"login as admin:{REDACTED} failed", REDACTED: [f"x {REDACTED} y", [REDACTED]], "n": 3}


def test_nothing_to_hide_leaves_the_value_as_it_is() -> None:
    doc = {"a": "b"}
    assert redact(doc, []) is doc
    assert redact("text", [None, ""]) == "text"


def test_replace_everywhere_puts_each_text_s_own_replacement() -> None:
    shown = replace_everywhere("b1:9092 then b1", {"b1:9092": "the brokers", "b1": "a broker"})
    assert shown == "the brokers then a broker"


def test_a_password_counts_as_given_and_as_written_into_a_url() -> None:
    assert password_forms("p@ss/w:rd") == {"p@ss/w:rd", "p%40ss%2Fw%3Ard"}
    assert password_forms(None) == set() and password_forms("") == set()


def test_a_url_shows_without_its_password() -> None:
    shown = redact_url("postgresql://tidemark:s3cret-pw@db:5432/state")
    assert shown == f"postgresql://tidemark:{REDACTED}@db:5432/state"
    assert redact_url("not a url") == "<unparseable URL>"
