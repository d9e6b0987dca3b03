"""A re-drive's plan (:func:`tidemark.planning.plan.redrive_plan`): it claims dead letters, not ranges; its id is
the hash of its feed and letters, checked when the plan is read back; it is no trigger's mode."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tidemark.errors import ConfigError
from tidemark.planning.plan import REDRIVE_PREFIX, Plan, redrive_plan, redrive_plan_id
from tidemark.planning.requests import run_request

LETTERS = (("0123abcd", "orders", 1, 40), ("0123abcd", "orders", 0, 7), ("ffff0000", "orders", 0, 3))


def test_a_redrive_plans_letters_are_its_id_and_an_edit_is_refused() -> None:
    plan = redrive_plan("orders", "orders-group", "read_committed", LETTERS, "2026-12-07T00:00:00+00:00")
    assert plan.plan_id.startswith(REDRIVE_PREFIX) and plan.plan_id == redrive_plan_id("orders", reversed(LETTERS))
    assert (plan.mode, plan.commit, plan.partitions, plan.total_records) == ("redrive", False, (), 3)
    assert plan.letters == tuple(sorted(LETTERS))
    assert Plan.from_json(plan.to_json()) == plan  # as the run dir's plan.json reads back
    edited = json.loads(plan.to_json())
    edited["letters"] = edited["letters"][:2]  # one letter dropped by hand: not the plan its id names
    with pytest.raises(ConfigError, match="does not match its content"):
        Plan.from_dict(edited)
    other = redrive_plan("orders", "orders-group", "read_committed", LETTERS[:2], "now")
    assert other.plan_id != plan.plan_id  # other letters, another publication
    assert replace(plan, created_at="later").plan_id == plan.plan_id  # the same letters, the same publication


def test_redrive_is_no_mode_a_trigger_may_ask_for() -> None:
    with pytest.raises(ConfigError, match="mode must be"):
        run_request("redrive")
