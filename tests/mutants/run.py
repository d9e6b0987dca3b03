"""``make mutants``: break Tidemark on purpose, one way at a time, and show the tests that go red.

Each mutant below is one deliberate breakage of a guarantee the docs state (docs/guide/guarantees.md), written as
exact text replacements in one or two files. For each, the runner copies the working tree
(tracked and untracked files, as they are now) into a scratch folder, applies the
breakage there (it refuses to run a mutant whose text is not found exactly once: a
breakage that no longer applies is reported, never skipped), and runs only the tests
that must catch it, with the scratch copy's ``tidemark`` first on the path (checked).
A mutant is *caught* when at least one of its tests *fails on an assertion*: an
``assert`` or ``pytest.fail`` (``pytest.raises`` that saw no exception, a pytest-timeout
of a breakage that hangs) in the tests' own code, read from the JUnit XML of the run
(:func:`classify`). A test that errors (a fixture that could not start, an import that
broke) proves nothing about the guarantee, nor does one whose body died of a product
exception it did not assert (a ``StuckRunError`` out of a helper, an ``assert`` inside
``tidemark``): both are listed apart and do not count. The table lists every mutant, the
tests that failed on an assertion, those that raised or errored, and caught yes/no; the exit code is
non-zero when any mutant survived, did not apply or ran none of its tests. Every selected
test first runs on an unbroken copy (the baseline; ``--no-baseline`` skips it): a test
red there proves nothing, and the run stops.

Tests that start and stop brokers (``tests/faults``) start their own cluster, so the
runner drops ``TIDEMARK_TEST_KAFKA_HOME`` for a mutant that selects any of them.

    python -m tests.mutants.run [--only NAME ...] [--baseline] [--keep]

The result also goes to ``tests/mutants/last-run.json`` (with ``--only``, merged into the
outcomes recorded for the other mutants), which ``make faults-table`` reads to say which
fault scenarios were shown red by a mutant.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAST_RUN = Path(__file__).with_name("last-run.json")


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    breaks: str  # the guarantee, as the docs state it
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]  # pytest node ids that must go red
    timeout_s: int | None = None  # per test (pytest-timeout), for a breakage that hangs instead of failing


SCENARIOS = "tests/faults/test_scenarios.py"
VIEW = "include/tidemark/web/app.py"
ARROW_AVRO = "include/tidemark/spark/arrow_avro.py"
AVRO = "include/tidemark/spark/avro.py"
PROTOBUF = "include/tidemark/spark/protobuf.py"
CHANGES = "include/tidemark/output/changes.py"
CHANGES_TEST = "tests/unit/output/test_changes.py"
RE_SENT_TEST = (
    "tests/unit/output/test_changes_order.py::"
    "test_a_deleted_key_stays_deleted_when_a_restarted_worker_re_sends_its_insert_below_every_clock"
)
VERIFY = "include/tidemark/runs/verify.py"
VERIFY_TEST = "tests/integration/runs/test_verify.py::"

MUTANTS = (
    Mutant(
        "commit-lock-removed",
        "commits of one group take turns (the per-group lock in commit_run)",
        (
            Edit(
                "include/tidemark/runs/finish.py",
                "            with checkpoints.commit_lock(plan.group):\n                settled = settle(",
                "            if True:\n                settled = settle(",
            ),
        ),
        (f"{SCENARIOS}::test_two_commits_of_one_group_at_the_same_time[local]",),
    ),
    Mutant(
        "plan-ends-as-positions",
        "every range is read to its end (validation compares where the reader stopped)",
        (Edit("include/tidemark/job/steps.py", "positions=source.positions,", "positions=job.plan.ends(),"),),
        ("tests/integration/job/test_job.py::test_job_refuses_a_range_the_reader_left_short",),
    ),
    Mutant(
        "bad-record-to-good-output",
        "only validated records are published (a bad record staged as good)",
        (
            Edit(
                "include/tidemark/validation/rules.py",
                "        if self.rules:\n            chunks = [",
                "        if False:  # every row that decoded is staged ok\n            chunks = [",
            ),
        ),
        (f"{SCENARIOS}::test_malformed_records[quarantine]",),
    ),
    Mutant(
        "bad-record-to-good-output-unchecked",
        "only validated records are published (a bad record staged as good, and the publish's count check off)",
        (
            Edit(
                "include/tidemark/validation/rules.py",
                "        if self.rules:\n            chunks = [",
                "        if False:  # every row that decoded is staged ok\n            chunks = [",
            ),
            Edit("include/tidemark/output/parquet.py", "if want is not None and have != want:", "if False:"),
        ),
        (
            f"{SCENARIOS}::test_validation_fails_on_one_bad_record",
            f"{SCENARIOS}::test_secrets_never_written",
        ),
    ),
    Mutant(
        "reader-skips-last-record",
        "nothing lost: the reader yields every record of a range, the last one too",
        (
            Edit(
                "include/tidemark/spark/source.py",
                "keep = valid_slot & (offsets >= wave.low[slots]) & (offsets < wave.end[slots])",
                "keep = valid_slot & (offsets >= wave.low[slots]) & (offsets < wave.end[slots] - 1)",
            ),
        ),
        (
            f"{SCENARIOS}::test_no_new_data_after_a_normal_run",
            "tests/integration/spark/test_read.py::test_reads_exactly_the_planned_ranges",
        ),
    ),
    Mutant(
        "reader-reads-past-the-end",
        "the end of every range is frozen when the plan is made (the reader keeps records past it)",
        (
            Edit(
                "include/tidemark/spark/source.py",
                "keep = valid_slot & (offsets >= wave.low[slots]) & (offsets < wave.end[slots])",
                "keep = valid_slot & (offsets >= wave.low[slots])",
            ),
        ),
        (f"{SCENARIOS}::test_records_committed_between_planning_and_the_read",),
    ),
    Mutant(
        "reader-never-gives-up",
        "a range that cannot reach its end fails with an error naming it (the reader's stall timeout)",
        (
            Edit(
                "include/tidemark/spark/source.py",
                "elif wave.open and time.monotonic() - last_progress > stall_timeout_s:",
                "elif False:",
            ),
        ),
        ("tests/integration/spark/test_read.py::test_a_range_that_cannot_reach_its_end_fails_with_the_stall_error",),
        timeout_s=90,
    ),
    Mutant(
        "publish-not-exclusive",
        "a plan is published once, also by two attempts at the same time (the rename into place)",
        (
            Edit(
                "include/tidemark/output/parquet.py",
                "os.rename(staging, final)  # atomic",
                "shutil.rmtree(final, ignore_errors=True); os.rename(staging, final)  # atomic",
            ),
        ),
        (
            "tests/integration/output/test_sink.py::test_two_attempts_publishing_one_plan_at_the_same_time_publish_it_once",
        ),
    ),
    Mutant(
        "iceberg-publish-not-exclusive",
        "a plan is published once, also by two attempts at the same time (the Iceberg commit's compare-and-set on "
        "the table the plan-id check read)",
        (
            Edit(
                "include/tidemark/output/iceberg.py",
                'done_extra = self.commit(table, list(doc["paths"]), doc["properties"], evolve_to,',
                'done_extra = self.commit(self.load() or table, list(doc["paths"]), doc["properties"], evolve_to,',
            ),
        ),
        (
            "tests/integration/test_feed_invariant.py"
            "::test_two_attempts_publishing_one_iceberg_plan_at_the_same_time_publish_it_once",
        ),
    ),
    Mutant(
        "state-writers-share-a-temp-file",
        "state files are replaced whole, also by two writers at once (a retried task beside its zombie)",
        (
            Edit(
                "include/tidemark/storage.py",
                'tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")',
                'tmp = path.with_name(f".{path.name}.tmp")',
            ),
        ),
        ("tests/integration/test_storage.py::test_two_local_writers_of_one_file_each_replace_it_whole",),
    ),
    Mutant(
        "commit-idle-check-skipped",
        "a commit is refused while the group has live members, with an error naming them (the idle-group check)",
        (
            Edit(
                "include/tidemark/runs/commit.py",
                "    _check_group_idle(kafka.describe_group(plan.group), plan)\n",
                "    pass\n",
            ),
        ),
        ("tests/integration/runs/test_commit.py::test_live_consumer_blocks_the_commit",),
    ),
    Mutant(
        "commit-share-group-accepted",
        "a share (KIP-932) or streams group id as a feed's group is refused at the commit, naming it",
        (
            Edit(
                "include/tidemark/runs/commit.py",
                '    if info.group_type == "other":\n',
                "    if False:\n",
            ),
        ),
        ("tests/integration/runs/test_commit.py::test_a_share_group_as_the_feeds_group_is_refused_naming_it",),
    ),
    Mutant(
        "bad-feed-file-stops-all",
        "a bad feed file stops only its own DAG: the others and the built-in DAGs load, the bad one is an import error",
        (
            Edit(
                "include/tidemark/config/models.py",
                "                problems.append(FeedProblem(files[0].stem, (str(files[0]),), str(exc)))\n",
                "                raise\n",
            ),
        ),
        (
            "tests/dags/test_dags.py"
            "::test_a_bad_feed_file_stops_only_its_own_dag_and_is_an_import_error_naming_file_and_field",
        ),
    ),
    Mutant(
        "commit-member-errors-unnamed",
        "a member joining between the compare-and-set read and the alter gets the commit refused as a group in use",
        (
            Edit(
                "include/tidemark/runs/commit.py",
                "        if set(failed.values()) & _MEMBER_ERRORS:\n",
                "        if False:\n",
            ),
        ),
        (
            "tests/integration/runs/test_commit.py"
            "::test_a_member_joining_between_the_compare_and_the_alter_gets_the_commit_refused",
        ),
    ),
    Mutant(
        "commit-read-back-skipped",
        "a commit another writer undid in part is not recorded as done (the read-back after the alter)",
        (
            Edit(
                "include/tidemark/runs/commit.py",
                "    _verify(plan, kafka.committed(plan.group, tps), metadata)\n",
                "    pass\n",
            ),
        ),
        (
            "tests/integration/test_feed_invariant.py"
            "::test_a_commit_another_writer_undid_in_part_fails_its_read_back_and_the_next_run_finishes_it",
        ),
    ),
    Mutant(
        "replay-trigger-drops-the-users-token",
        "a replay started from the view runs as the logged-in user (the view forwards their token to Airflow)",
        (
            Edit(VIEW, '    if auth := request.headers.get("authorization"):\n', "    if False:\n"),
            Edit(VIEW, '    elif token := request.cookies.get("_token"):\n', "    elif False:\n"),
        ),
        ("tests/e2e/test_view_runs.py::test_the_views_trigger_starts_the_replay_as_the_user",),
    ),
    Mutant(
        "fault-tally-counts-two-ways",
        "the faults table's records compared are its good plus its quarantined ones (rows with multiplicity in "
        "the total, distinct in the split)",
        (
            Edit(
                "tests/faults/harness.py",
                "            self.records_checked += 1\n",
                "            self.records_checked += expected[row]\n",
            ),
        ),
        ("tests/unit/test_fault_tally.py::test_records_compared_are_good_plus_quarantined_counted_as_distinct_rows",),
    ),
    Mutant(
        "publish-despite-a-moved-group",
        "every offset at most once in the feed's output (a cleared old run re-running its job)",
        (
            Edit(
                "include/tidemark/job/steps.py", "        refuse_if_moved(plan, connection, run_id)\n", "        pass\n"
            ),
        ),
        (
            "tests/integration/test_feed_invariant.py::test_cleared_old_dag_run_rerunning_after_later_runs_committed",
            "tests/e2e/test_cleared_run.py::test_a_cleared_old_run_publishes_nothing_twice",
        ),
    ),
    Mutant(
        "shown-before-the-commit",
        "the output shows only what the group committed (the job shows its publication at once, as before the "
        "commit protocol)",
        (
            Edit(
                "include/tidemark/output/parquet.py",
                "expect_quarantined=expect_quarantined, pending=run_id,",
                "expect_quarantined=expect_quarantined, pending=None,",
            ),
        ),
        (
            "tests/integration/runs/test_commit_protocol.py::test_a_reader_polling_a_race_never_sees_an_offset_twice",
            "tests/integration/runs/test_pipeline.py::test_crash_between_publish_and_commit_is_finished_by_the_next_run",
        ),
    ),
    Mutant(
        "output-overlap-unchecked",
        "every offset at most once in the feed's output (a plan overlapping what the output shows is kept out)",
        (
            Edit(
                "include/tidemark/runs/protocol.py",
                "    if not shows_in_feed_output(plan) or not plan.total_records or already is not None:\n"
                "        return None",
                "    if True:\n        return None",
            ),
        ),
        (
            "tests/unit/runs/test_protocol_model.py"
            "::test_an_operator_resetting_the_group_to_a_racing_runs_basis_shows_nothing_twice",
            "tests/integration/runs/test_commit_protocol.py::test_an_operator_reset_to_a_racing_runs_offsets",
        ),
    ),
    Mutant(
        "rewound-group-followed",
        "every offset at most once in the feed's output (a group an operator moved back starts at the output's end)",
        (
            Edit(
                "include/tidemark/planning/resolve.py",
                'moved_to = _Start(min(snap.shown, end), "shown")',
                "moved_to = start",
            ),
        ),
        ("tests/integration/runs/test_commit_protocol.py::test_a_group_rewound_by_an_operator_is_not_shown_twice",),
    ),
    Mutant(
        "committed-crash-discarded",
        "nothing a commit covered is deleted (a run whose Kafka commit landed before it died, the group then moved "
        "on by another writer, is shown, not discarded)",
        (
            Edit(
                "include/tidemark/runs/protocol.py",
                "if was_committing and kafka is not None and _group_past(plan, kafka):",
                "if False:",
            ),
        ),
        (
            "tests/integration/runs/test_commit_protocol.py"
            "::test_a_crash_after_the_kafka_commit_then_a_stray_consumer_loses_no_committed_record",
        ),
    ),
    Mutant(
        "open-runs-not-settled",
        "a run that finds a committed but not yet shown plan finishes it before planning anything new",
        (
            Edit(
                "include/tidemark/runs/start.py",
                "    if not request.dry_run:  # a dry run settles nothing: it changes nothing\n",
                "    if False:\n",
            ),
        ),
        (
            "tests/integration/runs/test_pipeline.py::test_crash_between_publish_and_commit_is_finished_by_the_next_run",
            "tests/integration/runs/test_commit_protocol.py"
            "::test_a_crash_after_the_kafka_commit_then_a_stray_consumer_loses_no_committed_record",
        ),
    ),
    Mutant(
        "staged-counts-unchecked",
        "nothing lost: the rows staged equal the records the reader produced, per partition",
        (
            Edit(
                "include/tidemark/job/steps.py",
                "    check_staged_counts(plan, read, files, staging.written_url)\n",
                "    pass\n",
            ),
        ),
        (
            "tests/integration/runs/test_commit_protocol.py"
            "::test_a_staged_file_lost_before_validation_fails_the_run_instead_of_counting_gaps",
        ),
    ),
    Mutant(
        "published-files-carry-staged-columns",
        "the published files hold the decoded records only: the digests, headers and raw bytes the job staged "
        "beside them are not published",
        (
            Edit(
                "include/tidemark/job/steps.py",
                "unpublished=tuple(c for c in UNPUBLISHED_COLUMNS if c in staged.files.columns),",
                "unpublished=(),",
            ),
        ),
        (
            "tests/integration/job/test_avro.py::test_avro_feed_publishes_the_scan_with_nested_and_logical_types",
            "tests/integration/job/test_job.py::test_spark_submit_publishes_once_and_reports",
            "tests/integration/job/test_read_task_staging.py::"
            "test_read_tasks_publish_the_scan_and_what_spark_would_with_the_same_statistics",
        ),
    ),
    Mutant(
        "quarantine-loses-raw-bytes",
        "a bad record is quarantined with its raw bytes, as Kafka holds them",
        (
            Edit(
                "include/tidemark/job/stage.py",
                "bad = F.col(OUTCOME_COLUMN) != F.lit(OK_OUTCOME)",
                "bad = F.lit(False)",
            ),
        ),
        (
            "tests/integration/job/test_avro.py::test_avro_feed_publishes_the_scan_with_nested_and_logical_types",
            "tests/integration/job/test_registry_formats.py"
            "::test_json_schema_feed_publishes_the_scan_typed_and_quarantines_bad_bodies",
        ),
    ),
    Mutant(
        "read-task-lengths-unchecked",
        "the read tasks stage a record only when its decoded fields encode to exactly its bytes",
        (Edit(ARROW_AVRO, "    if not np.array_equal(sizes, np.diff(offsets)):", "    if False:"),),
        (
            "tests/unit/spark/test_arrow_avro.py::test_a_byte_moved_between_two_values_is_caught_though_the_block_decodes",
        ),
    ),
    Mutant(
        "kafka-settings-unchecked",
        "a connection may set only librdkafka's documented client settings: none that loads code where a client "
        "is built",
        (
            Edit(
                "include/tidemark/kafka/connection.py",
                "    for key in settings:\n        name = str(key)",
                "    for key in ():\n        name = str(key)",
            ),
        ),
        (
            "tests/dags/test_connections.py::test_a_connection_naming_a_library_to_load_is_refused_before_any_client_"
            "loads_it",
        ),
    ),
    Mutant(
        "registry-redirects-anywhere",
        "the registry client sends its credentials to the registry's own origin only",
        (
            Edit(
                "include/tidemark/kafka/registry.py",
                "                        _check_redirect(origin, self._base, url, what)\n",
                "",
            ),
        ),
        (
            "tests/integration/kafka/test_registry_client.py::test_a_redirect_to_another_origin_is_refused_and_gets_no_"
            "credentials[another port]",
        ),
    ),
    Mutant(
        "lag-trigger-fires-twice",
        "a lag-triggered feed is not started twice for one threshold crossing, across triggerer restarts too",
        (
            Edit(
                "include/tidemark/orchestration/lag.py",
                "        if dict(reading.positions) == dict(last.positions) and since_s < settle_s:",
                "        if False:",
            ),
        ),
        (
            "tests/unit/orchestration/test_lag_rule.py::test_after_firing_it_waits_until_the_offsets_move",
            "tests/unit/orchestration/test_lag_trigger_state.py::test_it_fires_records_the_firing_and_a_rebuilt_"
            "instance_does_not_fire_again",
        ),
    ),
    Mutant(
        "spark-secrets-as-env-vars",
        "no connection secret is an argument or a variable of spark-submit, on any master",
        (
            Edit(
                "include/tidemark/orchestration/dags.py",
                "        self.env_vars = own_env  #",
                "        self.env_vars = {**own_env, **secrets_env}  #",
            ),
        ),
        (
            "tests/dags/test_spark_operator.py::test_no_secret_reaches_the_command_line_the_environment_or_the_log_on_"
            "yarn_or_kubernetes[yarn]",
        ),
    ),
    Mutant(
        "view-ignores-feed-access",
        "each feed answers only to users Airflow's auth manager allows on that feed's DAG",
        (Edit(VIEW, "        if name not in self.access.allowed(request, action, [name]):\n", "        if False:\n"),),
        (
            "tests/integration/web/test_web_access.py::test_the_other_feeds_run_files_and_docs_answer_403",
            "tests/integration/web/test_web_access.py::test_previews_and_replays_answer_only_to_their_feeds_users",
        ),
    ),
    Mutant(
        "replay-dag-trusts-its-trigger",
        "tidemark_replay and tidemark_backfill refuse a feed the triggering user may not run, at their first task",
        (Edit("include/tidemark/orchestration/access.py", "    if missing:\n", "    if False:\n"),),
        ("tests/dags/test_run_access.py::test_a_request_for_a_feed_the_user_may_not_run_is_refused",),
    ),
    Mutant(
        "replay-output-read-as-text",
        "a replay or backfill never publishes into a feed's output, whatever symlinks or broad roots allow",
        (Edit("include/tidemark/output/base.py", "    place = _resolved(target)\n", "    place = target.url\n"),),
        ("tests/unit/runs/test_replay_output.py::test_a_symlink_under_an_allowed_place_is_followed",),
    ),
    Mutant(
        "avro-body-end-unchecked",
        "Spark's path publishes an Avro record only when its fields read its body to the last byte",
        (Edit(AVRO, "    return end.isNotNull() & (end != BODY_END)", "    return end.isNotNull() & (end != end)"),),
        ("tests/integration/spark/test_avro_decode.py::test_only_records_that_do_not_decode_are_failed",),
    ),
    Mutant(
        "avro-boolean-byte-unchecked-spark",
        "an Avro boolean byte other than 0 or 1 is a bad record on Spark's path, its reason naming the field",
        (
            Edit(
                AVRO,
                '        return (column != F.lit(b"\\x00")) & (column != F.lit(b"\\x01"))',
                "        return column != column",
            ),
        ),
        (
            "tests/integration/spark/test_differential.py::test_a_boolean_byte_other_than_0_or_1_is_refused_on_both_paths_naming_the_field",
        ),
    ),
    Mutant(
        "avro-boolean-byte-unchecked-read-tasks",
        "the read tasks give way on an Avro boolean byte other than 0 or 1, naming the field",
        (Edit(ARROW_AVRO, "        if wrong.any():", "        if False:"),),
        (
            "tests/integration/spark/test_differential.py::test_a_boolean_byte_other_than_0_or_1_is_refused_on_both_paths_naming_the_field",
        ),
    ),
    Mutant(
        "avro-logical-types-unchecked",
        "a decimal resolves only at its own scale with at least its precision, a logical type only to itself",
        (
            Edit(
                AVRO,
                "_logical_incompatibility(parsed_reader, parsed_writer",
                "None and _logical_incompatibility(parsed_reader, parsed_writer",
            ),
        ),
        (
            "tests/integration/spark/test_avro_resolution.py::test_a_decimal_resolves_at_its_scale_with_at_least_its_precision",
        ),
    ),
    Mutant(
        "avro-decimal-narrowed-accepted",
        "a decimal read with a lower precision than it was written with is refused (a value may not fit)",
        (
            Edit(
                AVRO, "mine.getPrecision() >= theirs.getPrecision()", "mine.getPrecision() >= theirs.getPrecision() - 1"
            ),
        ),
        (
            "tests/integration/spark/test_avro_resolution.py::test_a_decimal_resolves_at_its_scale_with_at_least_its_precision",
        ),
    ),
    Mutant(
        "protobuf-map-values-unchecked",
        "a Protobuf field retyped inside a map's value message fails the run",
        (Edit(PROTOBUF, '            if _wire_kind(mine) == "message":', "            if False:"),),
        (
            "tests/unit/spark/test_protobuf_resolution.py::test_a_field_misread_anywhere_below_the_top_is_refused_naming_it",
        ),
    ),
    Mutant(
        "topic-pattern-searched",
        "a topic pattern must match the whole topic name",
        (
            Edit(
                "include/tidemark/config/models.py",
                "return re.fullmatch(self.pattern, topic) is not None",
                "return re.search(self.pattern, topic) is not None",
            ),
        ),
        (
            "tests/unit/config/test_topic_pattern_config.py::test_full_match_and_exclusions",
            "tests/unit/planning/test_topics.py::test_resolving_takes_the_full_matches_sorted_with_one_listing",
        ),
    ),
    Mutant(
        "topic-pattern-first-match-only",
        "a pattern feed picks up a topic created after its first run, and its output equals the scan of every "
        "matching topic",
        (
            Edit(
                "include/tidemark/planning/topics.py",
                "    matched = matching_topics(pattern, listed)\n",
                "    matched = matching_topics(pattern, listed)[:1]\n",
            ),
        ),
        (
            "tests/integration/runs/test_topic_patterns.py::test_a_pattern_feed_picks_up_a_topic_created_after_its_first_run",
        ),
    ),
    Mutant(
        "iceberg-ledger-not-written",
        "an Iceberg table knows its plans and position whatever snapshots were expired (the ledger property)",
        (
            Edit(
                "include/tidemark/output/iceberg.py",
                "                tx.set_properties({ledger_key(feed): after.to_json()})",
                "                pass",
            ),
        ),
        (
            "tests/integration/test_iceberg_maintenance.py::"
            "test_guarantees_survive_pyiceberg_compaction_and_snapshot_expiry",
        ),
    ),
    Mutant(
        "iceberg-ledger-overlap-unchecked",
        "an Iceberg table never takes a range it already holds, whatever the checkpoint store remembers",
        (
            Edit(
                "include/tidemark/output/ledger.py",
                "        if end > start and held is not None and start < held:",
                "        if False:",
            ),
        ),
        (
            "tests/integration/test_iceberg_maintenance.py::"
            "test_a_topic_recreated_after_expiry_starts_on_its_new_id_without_a_refusal",
            "tests/unit/output/test_table_ledger.py",
        ),
    ),
    Mutant(
        "dead-letters-of-unshown-plans",
        "a dead letter is visible only once its plan is shown (an Iceberg feed's: once the run ledger or the "
        "table's history shows it)",
        (
            Edit(
                "include/tidemark/output/deadletters.py",
                "    for plan_id, run_id in plans.items():\n",
                "    plans = {f.name.partition('=')[2]: None\n"
                "             for f in publisher.quarantine.children(folders_only=True)}\n"
                "    for plan_id, run_id in plans.items():\n",
            ),
        ),
        (
            "tests/integration/output/test_dead_letters.py::"
            "test_dead_letters_equal_the_oracles_bad_records_once_through_crashes_and_reruns[iceberg]",
        ),
    ),
    Mutant(
        "dead-letters-appended-twice",
        "an Iceberg feed's dead-letter table holds each dead letter once: a plan's rows are appended once, however "
        "often its promotion is entered",
        (
            Edit(
                "include/tidemark/output/dead_letter_table.py",
                "        if holds_plan(table, plan_id):\n",
                "        if False:\n",
            ),
        ),
        (
            "tests/integration/output/test_dead_letters.py::"
            "test_an_iceberg_feeds_dead_letter_table_is_appended_once_through_a_crash_between_its_two_commits",
        ),
    ),
    Mutant(
        "dead-letters-of-pending-plans",
        "a dead letter is visible only once its plan is shown (a Parquet feed's: once its manifest is in place)",
        (
            Edit(
                "include/tidemark/output/deadletters.py",
                "    for folder in root.children(folders_only=True) if root.exists() else []:\n",
                "    pending = [r / p.name for r in (root / '_pending').children(folders_only=True) "
                "for p in r.children(folders_only=True)] if (root / '_pending').exists() else []\n"
                "    for folder in [*root.children(folders_only=True), *pending] if root.exists() else []:\n",
            ),
            Edit(
                "include/tidemark/output/deadletters.py",
                "        manifest = load_manifest(root, plan_id)"
                "  # the commit point: a folder without one is not shown\n",
                "        manifest = load_manifest(folder.parent, plan_id)\n",
            ),
        ),
        (
            "tests/integration/output/test_dead_letters.py::"
            "test_dead_letters_equal_the_oracles_bad_records_once_through_crashes_and_reruns[parquet]",
        ),
    ),
    Mutant(
        "parquet-partitioning-ignored",
        "a Parquet feed's plan folder holds the Hive-style folders its partition_by chooses",
        (Edit("include/tidemark/output/parquet.py", 'if self.partitioning != "date":', "if False:"),),
        (
            "tests/integration/output/test_value_partitioning.py::"
            "test_parquet_partitioned_by_a_value_fields_day_then_by_its_value",
        ),
    ),
    Mutant(
        "partition-empty-string-in-the-null-folder",
        "no Iceberg data file holds both an empty string and null in its partition field (IsNull finds every null)",
        (
            Edit(
                "include/tidemark/output/partitioning.py",
                'return F.when(value == F.lit(""), F.lit(EMPTY_FOLDER)).otherwise(value)',
                "return value",
            ),
        ),
        (
            "tests/integration/output/test_value_partitioning.py::"
            "test_iceberg_never_mixes_an_empty_string_and_null_in_one_file_so_every_filter_finds_its_rows",
        ),
    ),
    Mutant(
        "partition-folders-by-session-zone",
        "each record is in the partition its field says, in UTC (a folder per UTC day, whatever the session's zone)",
        (
            Edit(
                "include/tidemark/output/partitioning.py",
                "return F.date_format(when, TIME_FOLDERS[part.granularity])",
                "return F.date_format(when + F.expr('INTERVAL 2 HOURS'), TIME_FOLDERS[part.granularity])",
            ),
        ),
        (
            "tests/integration/output/test_value_partitioning.py::"
            "test_parquet_partitioned_by_a_value_fields_day_then_by_its_value",
            "tests/integration/output/test_value_partitioning.py::"
            "test_iceberg_partitioned_by_a_value_fields_day_then_its_value_evolves_the_spec",
        ),
    ),
    Mutant(
        "changes-ledger-watermark-ignored",
        "a keyed table skips changes below its ledger's end (a replayed window resurrects no deleted key)",
        (
            Edit(
                CHANGES,
                "    if ledger is None:\n        return list(changes)",
                "    if True:\n        return list(changes)",
            ),
        ),
        (f"{CHANGES_TEST}::test_stale_changes_are_skipped_by_the_ledger_and_by_the_rows_position",),
    ),
    Mutant(
        "changes-row-position-ignored",
        "a keyed table never lets an older change overwrite a key's newer row (compared by position)",
        (
            Edit(
                CHANGES,
                "        elif held is not None and not newer(_position(c), held):",
                "        elif held is not None and False:",
            ),
        ),
        (f"{CHANGES_TEST}::test_stale_changes_are_skipped_by_the_ledger_and_by_the_rows_position",),
    ),
    Mutant(
        "changes-fold-keeps-first",
        "a plan's changes fold to the last change per key",
        (
            Edit(
                CHANGES, "        if kept is None or newer(_position(c), _position(kept)):", "        if kept is None:"
            ),
        ),
        (f"{CHANGES_TEST}::test_the_fold_keeps_the_last_change_per_key_and_a_tombstone_deletes",),
    ),
    Mutant(
        "redrive-takes-a-dead-letter-twice",
        "a re-drive publishes a dead letter at most once: one that another re-drive showed meanwhile is given up",
        (
            Edit(
                "include/tidemark/runs/protocol.py",
                "    if not clash:\n        return None\n",
                "    if not clash or True:\n        return None\n",
            ),
        ),
        (
            "tests/unit/runs/test_protocol_model.py::"
            "test_the_model_sees_two_overlapping_redrives_and_shows_each_letter_once",
            "tests/integration/runs/test_redrive.py::"
            "test_two_redrives_staged_at_once_over_overlapping_dead_letters_show_each_letter_once",
        ),
    ),
    Mutant(
        "redriven-dead-letters-listed-again",
        "a dead letter a re-drive published leaves the listing, so a second re-drive takes nothing",
        (
            Edit(
                "include/tidemark/output/deadletters.py",
                "        if by is not None:\n            if not redriven_too:\n",
                "        if by is not None:\n            if False:\n",
            ),
        ),
        (
            "tests/integration/runs/test_redrive.py::"
            "test_a_redrive_publishes_exactly_the_records_the_fixed_rule_passes_once[parquet]",
        ),
    ),
    Mutant(
        "masking-keeps-raw-bytes",
        "without keep_raw, a masked feed's quarantine holds no raw bytes of its records",
        (
            Edit(
                "include/tidemark/spark/masking.py",
                "(F.when(bad, F.col(c)) if kept else F.lit(None))",
                "F.when(bad, F.col(c))",
            ),
        ),
        (
            "tests/integration/job/test_masking.py::"
            "test_a_sensitive_marker_is_found_in_no_artefact_but_the_keep_raw_location[iceberg-False]",
        ),
    ),
    Mutant(
        "masking-skips-headers",
        "a feed's sensitive headers are masked before anything is staged, validated or published",
        (
            Edit(
                "include/tidemark/spark/masking.py",
                '    if masking.headers and "headers" in df.columns:\n',
                '    if False and masking.headers and "headers" in df.columns:\n',
            ),
        ),
        (
            "tests/unit/spark/test_masking.py::test_headers_by_name_and_the_key",
            "tests/integration/job/test_masking.py::"
            "test_a_sensitive_marker_is_found_in_no_artefact_but_the_keep_raw_location[iceberg-False]",
        ),
    ),
    Mutant(
        "masking-key-in-the-plan",
        "the masking key is in no Spark query plan or event log (the HMAC is a UDF's, the key in its closure)",
        (
            Edit(
                "include/tidemark/spark/masking.py",
                "    digest = _hash_udf(key)(_message(col, dtype))\n",
                "    digest = F.lower(F.hex(F.hmac(F.lit(key), _message(col, dtype))))\n",
            ),
        ),
        ("tests/unit/spark/test_masking.py::test_the_masking_key_reaches_no_plan_and_no_event_log",),
    ),
    Mutant(
        "masking-staged-by-read-tasks",
        "a masked feed's records are masked on every staging path (the read tasks leave such a feed to Spark)",
        (Edit("include/tidemark/job/stage.py", "    if feed.masking is not None:\n", "    if False:\n"),),
        (
            "tests/integration/job/test_masking.py::test_an_avro_feed_the_read_tasks_would_stage_is_masked_by_spark_"
            "and_its_paths_are_checked_when_planned",
        ),
    ),
    Mutant(
        "redrive-publishes-unmasked",
        "a masked feed's re-driven records are masked as a run masks them before they are staged",
        (
            Edit(
                "include/tidemark/job/redrive.py",
                "    return mask_records(decoded, masking, masking_key(masking, feed.name), feed.name)",
                "    return decoded",
            ),
        ),
        (
            "tests/integration/runs/test_redrive_masked.py::"
            "test_a_masked_feed_with_keep_raw_redrives_from_the_raw_bytes_and_publishes_them_masked_once[parquet]",
        ),
    ),
    Mutant(
        "redrive-decodes-masked-columns",
        "a masked feed's dead letter whose kept raw bytes are gone stays a dead letter (never decoded from its masked "
        "columns)",
        (
            Edit("include/tidemark/job/redrive.py", "        if raw is None:\n", "        if raw is None and False:\n"),
            Edit(
                "include/tidemark/job/redrive.py",
                "            found.append(replace(d, key=raw.key, value=raw.value, headers=raw.headers))",
                "            found.append(d if raw is None else\n"
                "                         replace(d, key=raw.key, value=raw.value, headers=raw.headers))",
            ),
        ),
        (
            "tests/integration/runs/test_redrive_masked.py::"
            "test_a_masked_feed_with_keep_raw_redrives_from_the_raw_bytes_and_publishes_them_masked_once[parquet]",
        ),
    ),
    Mutant(
        "changes-key-rule-dropped",
        "a Debezium change without its key's value is quarantined with a reason naming the key",
        (
            Edit(
                "include/tidemark/validation/rules.py",
                "    return rules + change_rules(feed, cols), untranslatable",
                "    return rules, untranslatable",
            ),
        ),
        (f"{CHANGES_TEST}::test_a_debezium_change_without_its_keys_value_breaks_the_feeds_change_rule_naming_the_key",),
    ),
    Mutant(
        "changes-tombstones-quarantined",
        "a keyed table's tombstone in a registry format deletes its key (decoded, not quarantined)",
        (
            Edit(
                "include/tidemark/spark/decode.py",
                '    tombstone = F.col("value").isNull() & F.lit(not tombstones)',
                '    tombstone = F.col("value").isNull()',
            ),
        ),
        (
            "tests/integration/output/test_change_streams.py::"
            "test_an_avro_state_feed_through_the_registry_deletes_by_its_tombstones[spark]",
        ),
    ),
    Mutant(
        "quarantine-shared-by-runs",
        "what a run stages is its own: two runs of one plan never share an Iceberg quarantine folder",
        (
            Edit(
                "include/tidemark/output/iceberg.py",
                '        return self.quarantine / f"run_id={run_id}" / f"plan_id={plan_id}"',
                '        return self.quarantine / f"plan_id={plan_id}"',
            ),
        ),
        (
            "tests/integration/output/test_dead_letters.py::"
            "test_two_runs_of_one_plan_keep_their_own_quarantine_through_a_refusal[iceberg]",
        ),
    ),
    Mutant(
        "discard-not-owed",
        "a discard is owed until done: one cut short is finished by the next settle",
        (
            Edit(
                "include/tidemark/runs/protocol.py",
                '        mark("discarding", detail)',
                '        mark("abandoned", detail)',
            ),
        ),
        (
            "tests/integration/runs/test_commit_protocol.py::"
            "test_a_refused_runs_discard_cut_short_is_finished_by_the_next_settle[parquet]",
        ),
    ),
    Mutant(
        "abandon-takes-back-a-shown-run",
        "tidemark abandon of a run the output already shows keeps it shown and leaves nothing pending",
        (
            Edit(
                "include/tidemark/runs/protocol.py",
                '    if already is not None and already.extra.get("run_id") == run_id:',
                "    if False:",
            ),
        ),
        (
            "tests/integration/output/test_dead_letters.py::"
            "test_abandoning_a_run_stuck_after_its_table_commit_keeps_its_records_and_leaves_nothing_pending",
        ),
    ),
    Mutant(
        "staging-of-a-live-job-removed",
        "a settle removes only staging folders no live job holds",
        (
            Edit(
                "include/tidemark/output/staging.py",
                "        if dead_only and not _dead(leftover):",
                "        if dead_only and False:",
            ),
        ),
        ("tests/unit/output/test_staging.py::test_a_staging_lock_outlives_no_process",),
    ),
    Mutant(
        "dead-jobs-staging-kept",
        "staging holds no raw bytes after a run: a killed job's folder is removed by the next settle",
        (
            Edit(
                "include/tidemark/runs/protocol.py",
                "        publisher.clear_staging(row.run_id, dead_only=True)",
                "        pass",
            ),
        ),
        (
            "tests/integration/output/test_staging_leftovers.py::"
            "test_a_driver_killed_mid_staging_leaves_raw_bytes_only_until_the_next_settle",
        ),
    ),
    Mutant(
        "staging-on-the-store-kept",
        "staging on the object store is removed once the publication holds its files",
        (
            Edit(
                "include/tidemark/output/parquet.py",
                "        staging.discard()  # the raw bytes staged (on the store too) go as soon as the publication",
                "        pass  # the raw bytes staged (on the store too) go as soon as the publication",
            ),
        ),
        ("tests/integration/output/test_staging_leftovers.py::test_staging_on_the_store_is_removed_after_the_run",),
    ),
    Mutant(
        "feeds-overlapping-paths-load",
        "feeds whose paths overlap (equal, inside, or on another feed's .pending/.quarantine/.dead_letters siblings) "
        "are refused at load, naming both files",
        (
            Edit(
                "include/tidemark/config/ownership.py",
                "    how = path_relation(a.value, b.value)\n",
                "    how = None if a.value != b.value else path_relation(a.value, b.value)\n",
            ),
        ),
        (
            "tests/unit/config/test_ownership_config.py::"
            "test_feeds_that_overlap_are_refused_at_load_naming_both_files_and_the_fields[output-inside-output]",
        ),
    ),
    Mutant(
        "feeds-sharing-a-group-load",
        "two feeds with one consumer group are refused at load",
        (
            Edit(
                "include/tidemark/config/ownership.py",
                'return Clash(a, b, "is") if a.value == b.value else None\n    if a.kind == "table"',
                'return None\n    if a.kind == "table"',
            ),
        ),
        (
            "tests/unit/config/test_ownership_config.py::"
            "test_feeds_that_overlap_are_refused_at_load_naming_both_files_and_the_fields[same-group]",
        ),
    ),
    Mutant(
        "feed-own-quarantine-in-its-table",
        "a feed's iceberg.quarantine inside its own table location is refused at load",
        (
            Edit(
                "include/tidemark/config/models.py", "        own = own_clashes(self.claims())\n", "        own = []\n"
            ),
        ),
        (
            "tests/unit/config/test_ownership_config.py::"
            "test_a_feed_whose_own_paths_overlap_is_refused_naming_its_file_and_fields[quarantine-in-own-table]",
        ),
    ),
    Mutant(
        "maintenance-lists-the-whole-location",
        "maintenance deletes nothing another table or publication holds inside its table's location",
        (
            Edit(
                "include/tidemark/output/maintenance.py",
                '    mine = [(rel, info) for rel, info in found if not _foreign(rel.split("/"), roots)]',
                "    mine = list(found)",
            ),
        ),
        (
            "tests/integration/output/test_maintenance_ownership.py::"
            "test_maintenance_deletes_only_its_own_tables_files[table-in-data]",
            "tests/integration/output/test_maintenance_ownership.py::"
            "test_maintenance_deletes_only_its_own_tables_files[parquet-output-in-data]",
        ),
    ),
    Mutant(
        "maintenance-ignores-open-runs",
        "maintenance keeps the files of runs the run ledger holds open",
        (Edit("include/tidemark/output/maintenance.py", "    plans = tuple(open_plans)\n", "    plans = ()\n"),),
        (
            "tests/integration/output/test_maintenance_ownership.py::"
            "test_maintenance_deletes_only_its_own_tables_files[quarantine]",
        ),
    ),
    Mutant(
        "maintenance-interrupt-deletes-compacted-files",
        "an interrupted compaction never deletes a file a committed snapshot names",
        (
            Edit(
                "include/tidemark/output/maintenance.py",
                "        if not sent:\n            _delete_files(table, new)",
                "        _delete_files(table, new)",
            ),
        ),
        (
            "tests/integration/output/test_maintenance_ownership.py::"
            "test_a_sigint_at_each_maintenance_step_never_deletes_a_file_a_kept_snapshot_names"
            "[maintenance.after_compaction]",
        ),
    ),
    Mutant(
        "table-owner-unchecked",
        "a feed opening another feed's table is refused",
        (
            Edit(
                "include/tidemark/output/owner.py",
                "    if owner is not None:\n        raise ConfigError(",
                "    if owner is not None and False:\n        raise ConfigError(",
            ),
        ),
        (
            "tests/integration/output/test_table_owner.py::"
            "test_a_table_is_created_owned_and_refused_to_another_feed_naming_both",
        ),
    ),
    Mutant(
        "redrive-letters-only-in-run-folder",
        "what a re-drive took is read from the run ledger, so removing run folders re-lists and re-drives nothing",
        (
            Edit(
                "include/tidemark/output/deadletters.py",
                "    text = (kept or {}).get(row.run_id)\n",
                "    text = None\n",
            ),
        ),
        (
            "tests/integration/runs/test_redrive_ledger.py::"
            "test_pruned_run_folders_change_nothing_a_redrive_took[parquet-sqlite]",
        ),
    ),
    Mutant(
        "redrive-record-never-adopted",
        "a re-drive recorded only in its run folder is copied into the run ledger by the next re-drive",
        (
            Edit(
                "include/tidemark/runs/redrive.py",
                "            store.adopt_redrive(row.group, row.run_id, record.to_json())\n",
                "            pass\n",
            ),
        ),
        (
            "tests/integration/runs/test_redrive_ledger.py::"
            "test_a_redrive_recorded_only_in_its_run_folder_is_adopted_and_one_recorded_nowhere_refuses",
        ),
    ),
    Mutant(
        "redrive-with-unknown-letters-chooses-again",
        "a re-drive refuses while a published re-drive's letters are recorded nowhere",
        (
            Edit(
                "include/tidemark/runs/redrive.py",
                "    if unknown:\n        folders =",
                "    if False:\n        folders =",
            ),
        ),
        (
            "tests/integration/runs/test_redrive_ledger.py::"
            "test_a_redrive_recorded_only_in_its_run_folder_is_adopted_and_one_recorded_nowhere_refuses",
        ),
    ),
    Mutant(
        "table-ledger-ignores-rollback",
        "recovery from an Iceberg table uses only positions of plans in the current snapshot's ancestry",
        (Edit("include/tidemark/output/ledger.py", "    if not rolled:\n", "    if True:\n"),),
        (
            "tests/unit/output/test_table_ledger.py::test_a_rolled_back_plan_whose_snapshot_is_kept_gives_its_starts_back",
            "tests/integration/test_iceberg_rollback.py::"
            "test_recovery_from_the_table_uses_only_the_current_ancestry[rolled-back]",
        ),
    ),
    Mutant(
        "table-ledger-rollback-unnamed",
        "a rollback the table ledger finds is named in a table_ledger_mismatch event",
        (
            Edit(
                "include/tidemark/output/iceberg.py",
                "                events=mismatch_events(checked, self.table_name),\n",
                "                events=(),\n",
            ),
        ),
        (
            "tests/integration/test_iceberg_rollback.py::"
            "test_recovery_from_the_table_uses_only_the_current_ancestry[rolled-back]",
        ),
    ),
    Mutant(
        "dead-letters-of-another-feeds-parquet-plans",
        "a feed lists and re-drives only the Parquet plans whose manifest names it",
        (
            Edit(
                "include/tidemark/output/deadletters.py",
                "        if manifest is None or manifest.feed != feed:\n",
                "        if manifest is None:\n",
            ),
        ),
        (
            "tests/integration/output/test_dead_letters_owner.py::test_a_feed_lists_and_redrives_only_the_plans_it_wrote[parquet]",
        ),
    ),
    Mutant(
        "dead-letters-of-another-feeds-iceberg-plans",
        "a feed's Iceberg folder fallback reads only snapshots whose summary names the feed",
        (
            Edit(
                "include/tidemark/output/deadletters.py",
                "        if summary.get(FEED_KEY) != publisher.feed.name:",
                "        if False:",
            ),
        ),
        (
            "tests/integration/output/test_dead_letters_owner.py::test_a_feed_lists_and_redrives_only_the_plans_it_wrote[iceberg]",
        ),
    ),
    Mutant(
        "verify-ignores-a-duplicate",
        "tidemark verify names every offset the feed's output holds twice",
        (
            Edit(
                "include/tidemark/runs/verify.py",
                "    return np.unique(np.concatenate([_twice(data), _twice(quarantined),",
                "    return np.unique(np.concatenate([_empty(), _twice(quarantined),",
            ),
        ),
        (
            "tests/unit/runs/test_verify.py::test_held_twice",
            "tests/integration/runs/test_verify.py::"
            "test_a_clean_parquet_feed_verifies_clean_and_each_planted_defect_is_named",
        ),
    ),
    Mutant(
        "verify-digest-skips-the-value",
        "tidemark verify recomputes each range's digest from Kafka's bytes as the job does",
        (Edit("include/tidemark/spark/rowhash.py", "    h, _ = _fold_column(h, values)\n", ""),),
        ("tests/unit/spark/test_rowhash.py::test_the_digest_equals_sparks",),
    ),
    Mutant(
        "changes-op-rule-dropped",
        "a Debezium record with an image but a null op is quarantined in the job (GX's be_in_set passes a null)",
        (
            Edit(
                "include/tidemark/validation/rules.py",
                "    if images:\n        rules.append(RowRule(CHANGE_OP_LABEL",
                "    if False:\n        rules.append(RowRule(CHANGE_OP_LABEL",
            ),
        ),
        (
            f"{CHANGES_TEST}::test_the_jobs_rules_and_the_merges_own_check_refuse_the_same_changes",
            "tests/integration/output/test_change_streams.py::"
            "test_a_debezium_change_without_op_is_a_dead_letter_before_the_commit_not_a_stuck_merge",
        ),
    ),
    Mutant(
        "changes-staged-check-skipped",
        "the job checks every staged change with the merge's own check before the commit",
        (
            Edit(
                "include/tidemark/output/iceberg.py",
                "        self.check_staged(plan.plan_id, [path for path, _ in data])\n",
                "",
            ),
        ),
        (
            "tests/integration/output/test_change_streams.py::"
            "test_a_debezium_change_without_op_is_a_dead_letter_before_the_commit_not_a_stuck_merge",
        ),
    ),
    Mutant(
        "changes-topic-id-ignored",
        "a recreated topic's changes apply over the old topic's rows, whatever their offsets",
        (
            Edit(
                CHANGES,
                "    return held[1] == c.topic and held[4] is not None and c.topic_id is not None",
                "    return False and held[1] == c.topic and held[4] is not None and c.topic_id is not None",
            ),
        ),
        (
            "tests/integration/output/test_change_streams.py::"
            "test_a_recreated_topics_changes_apply_over_the_old_topics_rows",
        ),
    ),
    Mutant(
        "changes-many-to-one-key-mask-allowed",
        "masking that is not one-to-one (redact, truncate) is refused on a keyed table's key column",
        (
            Edit(
                "include/tidemark/config/models.py",
                '            if kind in ("redact", "truncate"):',
                "            if False:",
            ),
        ),
        (f"{CHANGES_TEST}::test_masking_that_is_not_one_to_one_is_refused_on_a_key_column_naming_file_and_field",),
    ),
    Mutant(
        "changes-source-position-ignored",
        "a Debezium change is ordered by its source position (PostgreSQL's LSN), not Kafka's timestamps",
        (Edit(CHANGES, '    if source.get("lsn") is not None:', "    if False:"),),
        (
            f"{CHANGES_TEST}::test_a_debezium_change_is_ordered_by_its_source_position",
            "tests/unit/output/test_changes_order.py::"
            "test_a_key_deleted_in_one_partition_does_not_come_back_by_an_older_change_read_later",
        ),
    ),
    Mutant(
        "changes-delete-markers-forgotten",
        "a deleted key is remembered: an older change read later from another partition does not bring it back",
        (
            Edit(
                CHANGES,
                "        held = current.get(key) or markers.get(key_text(key))",
                "        held = current.get(key)",
            ),
        ),
        (
            "tests/unit/output/test_changes_order.py::"
            "test_a_key_deleted_in_one_partition_does_not_come_back_by_an_older_change_read_later",
        ),
    ),
    Mutant(
        "changes-clock-not-kept",
        "a state record's order is its partition's clock (the running maximum), never going back along the offsets",
        (
            Edit(
                CHANGES,
                "            order = max(here, (3, c.timestamp)) if state else here",
                "            order = (3, c.timestamp) if state else here",
            ),
        ),
        (f"{CHANGES_TEST}::test_the_order_is_the_partitions_clock_so_it_never_goes_back_within_a_partition",),
    ),
    Mutant(
        "changes-markers-pruned-at-the-clock",
        "a delete marker is dropped only when every partition's clock is strictly past it",
        (
            Edit(
                CHANGES,
                "    return kept | {k: m for k, m in markers.items() if not m[0] < floor}",
                "    return kept | {k: m for k, m in markers.items() if not m[0] <= floor}",
            ),
        ),
        (
            "tests/unit/output/test_changes_order.py::"
            "test_a_delete_marker_is_dropped_only_once_every_partitions_clock_is_strictly_past_it",
        ),
    ),
    Mutant(
        "docs-drift-flags-unchecked",
        "prose naming a tidemark flag the command does not have fails the docs test",
        (
            Edit(
                "tests/support/docs_drift.py",
                'if flag.startswith("--") and re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and flag not in allowed:',
                "if False:",
            ),
        ),
        ("tests/unit/test_docs.py::test_a_planted_mistake_is_named_with_its_line",),
    ),
    Mutant(
        "docs-drift-yaml-keys-unchecked",
        "a feed snippet in the docs with a key the feed models lack fails the docs test",
        (
            Edit(
                "tests/support/docs_drift.py",
                "            if not _path_known(path, k):\n                yield",
                "            if False:\n                yield",
            ),
        ),
        ("tests/unit/test_docs.py::test_a_planted_mistake_is_named_with_its_line",),
    ),
    Mutant(
        "view-chart-runs-by-position",
        "the view's run charts put each run at its start time on a dated time axis",
        (Edit(VIEW, "    if runs and all(t is not None for t in times):", "    if False:"),),
        (
            "tests/unit/web/test_web_view.py::test_runs_sit_on_a_time_axis_by_start_time_with_dates_where_the_day_changes",
        ),
    ),
    Mutant(
        "kafka-file-settings-allowed",
        "an Airflow connection may set a librdkafka setting that reads a file or reaches an address only when the "
        "deployment allow-lists it by name",
        (
            Edit(
                "include/tidemark/kafka/connection.py",
                "and k not in allowed and (k, v) not in _HARMLESS_VALUES",
                "and k in () and (k, v) not in _HARMLESS_VALUES",
            ),
        ),
        (
            "tests/unit/kafka/test_connection.py::"
            "test_a_connection_may_set_a_file_or_url_reading_setting_only_when_the_deployment_allows_it_by_name",
            "tests/dags/test_connections.py::"
            "test_a_connection_cannot_post_a_local_file_to_an_address_it_chooses_unless_the_deployment_allows_it",
        ),
    ),
    Mutant(
        "kafka-assertion-file-unlisted",
        "every file-reading librdkafka setting needs allowing: sasl.oauthbearer.assertion.file among them",
        (
            Edit(
                "include/tidemark/kafka/connection.py",
                '    "sasl.oauthbearer.assertion.file": "librdkafka reads the file it names and POSTs it to the token '
                'endpoint",\n',
                "",
            ),
        ),
        (
            "tests/unit/kafka/test_connection.py::"
            "test_a_connection_may_set_a_file_or_url_reading_setting_only_when_the_deployment_allows_it_by_name",
        ),
    ),
    Mutant(
        "masked-checksum-of-raw-bytes",
        "a masked feed's range checksum and bytes are of its masked records, never of their raw bytes",
        (
            Edit(
                "include/tidemark/job/stage.py",
                '    digest = masked_row_digest(own) if masked else row_digest(raw["value"], raw["key"])\n',
                '    digest = row_digest(raw["value"], raw["key"])\n',
            ),
        ),
        (
            "tests/integration/job/test_masked_digests.py::"
            "test_a_one_record_range_of_a_masked_feed_publishes_no_digest_a_guess_can_be_checked_against",
        ),
    ),
    Mutant(
        "masked-checksum-shown-in-view",
        "the view's JSON shows no checksum or bytes of a masked feed's ranges",
        (Edit(VIEW, '    if masked:\n        doc["ranges"]', '    if False:\n        doc["ranges"]'),),
        (
            "tests/integration/web/test_view_security.py::"
            "test_a_masked_feeds_json_shows_no_checksum_or_bytes_of_any_run_even_one_written_before",
        ),
    ),
    Mutant(
        "masking-one-key-for-every-feed",
        "each hashed field's key is derived for its feed and field (HKDF), not the deployment's key itself",
        (
            Edit(
                "include/tidemark/spark/masking.py",
                "    key = field_key(key, feed, path)  # this feed's and this field's own\n",
                "",
            ),
        ),
        (
            "tests/unit/spark/test_masking.py::test_hash_is_keyed_hmac_sha256_and_stable",
            "tests/unit/spark/test_masking.py::test_two_feeds_and_two_fields_hash_one_value_to_unrelated_digests",
        ),
    ),
    Mutant(
        "masking-key-feed-not-in-derivation",
        "a field's key depends on its feed: two feeds hash one value differently",
        (
            Edit(
                "include/tidemark/config/masking.py",
                '    info = b"\\0".join((KEY_INFO, feed.encode(), field.encode()))\n',
                '    info = b"\\0".join((KEY_INFO, b"", field.encode()))\n',
            ),
        ),
        ("tests/unit/spark/test_masking.py::test_two_feeds_and_two_fields_hash_one_value_to_unrelated_digests",),
    ),
    Mutant(
        "masking-weak-key-accepted",
        "a masking key with fewer than 256 random bits, a repetition or low entropy is refused",
        (
            Edit(
                "include/tidemark/config/masking.py",
                "    if entropy < max(KEY_MIN_CHAR_ENTROPY, KEY_ENTROPY_SHARE * min(per_char, math.log2(len(key)))):\n",
                "    if entropy < 0:\n",
            ),
        ),
        ("tests/unit/spark/test_masking.py::test_a_weak_masking_key_is_refused_naming_why_and_how_to_make_one",),
    ),
    Mutant(
        "masking-headers-case-sensitive",
        "a masked header is masked whatever the case of its name in the record",
        (
            Edit(
                "include/tidemark/spark/masking.py",
                '        return F.lower(h.getField("key")) == F.lit(name)\n',
                '        return h.getField("key") == F.lit(name)\n',
            ),
        ),
        ("tests/unit/spark/test_masking.py::test_header_names_are_matched_whatever_their_case",),
    ),
    Mutant(
        "dead-letters-counted-whole",
        "the dead-letter page shows 25 reasons and days a page, the rest on the next pages",
        (
            Edit(
                VIEW,
                "        chosen = counts.groups[(page - 1) * DEAD_LETTER_GROUPS : page * DEAD_LETTER_GROUPS]\n",
                "        chosen = counts.groups\n",
            ),
        ),
        (
            "tests/integration/web/test_view_security.py::"
            "test_the_dead_letter_page_is_paginated_clips_headers_and_is_rate_limited_per_user",
        ),
    ),
    Mutant(
        "dead-letter-headers-unclipped",
        "a dead letter's headers are clipped: at most 16, each name and value cut",
        (
            Edit(
                VIEW,
                "                      for k, v in headers[:HEADERS_SHOWN]]",
                "                      for k, v in headers]",
            ),
        ),
        (
            "tests/integration/web/test_view_security.py::"
            "test_the_dead_letter_page_is_paginated_clips_headers_and_is_rate_limited_per_user",
        ),
    ),
    Mutant(
        "dead-letters-not-rate-limited",
        "each user may open a bounded number of dead-letter pages a minute",
        (
            Edit(
                VIEW, "        wait = self.dead_letter_limit.wait_s(self.access.who(request))\n", "        wait = 0.0\n"
            ),
        ),
        (
            "tests/integration/web/test_view_security.py::"
            "test_the_dead_letter_page_is_paginated_clips_headers_and_is_rate_limited_per_user",
        ),
    ),
    Mutant(
        "gx-values-to-readers",
        "GX's observed values, exception texts and bad-record samples reach only users with the runs right",
        (
            Edit(
                VIEW,
                "    if not values and isinstance(validation, dict):\n",
                "    if False and isinstance(validation, dict):\n",
            ),
        ),
        (
            "tests/integration/web/test_view_security.py::"
            "test_gx_observed_values_exception_texts_and_samples_reach_only_users_who_may_read_runs",
        ),
    ),
    Mutant(
        "dead-letter-counts-ignore-redrives",
        "the bounded counts leave re-driven letters out and count re-checked ones under their newest reasons",
        (
            Edit(
                "include/tidemark/output/deadletters.py",
                "        if codes_column and not touched:\n",
                "        if codes_column:\n",
            ),
        ),
        (
            "tests/integration/runs/test_redrive.py::"
            "test_a_redrive_publishes_exactly_the_records_the_fixed_rule_passes_once[parquet]",
        ),
    ),
    Mutant(
        "run-check-all-admins-under-any-manager",
        "simple_auth_manager_all_admins lets everyone through under SimpleAuthManager only",
        (
            Edit(
                "include/tidemark/orchestration/access.py",
                "    if all_admins and isinstance(manager, SimpleAuthManager):\n",
                "    if all_admins:\n",
            ),
        ),
        (
            "tests/dags/test_run_access.py::test_all_admins_and_the_dag_test_name_pass_only_where_simple_auth_manager_"
            "says_so",
        ),
    ),
    Mutant(
        "staging-base-open-to-others",
        "the default local staging base is the user's own folder, mode 0700",
        (Edit("include/tidemark/output/staging.py", "    if found.st_mode & 0o077:\n", "    if False:\n"),),
        ("tests/unit/output/test_staging_base.py",),
    ),
    Mutant(
        "settling-outside-the-lock",
        "commits of one group take turns: a new plan settles the open runs under the group's commit lock (the "
        "listing stays under it, the settling moved out)",
        (
            Edit(
                "include/tidemark/runs/protocol.py",
                "    with store.commit_lock(group):\n        for row in filter(which, store.open_runs(feed)):",
                "    with store.commit_lock(group):\n        rows = list(filter(which, store.open_runs(feed)))\n"
                "    for row in rows:",
            ),
        ),
        (
            "tests/unit/runs/test_protocol_model.py::"
            "test_a_plan_step_settles_a_staged_run_under_the_lock_while_its_own_commit_waits",
        ),
    ),
    Mutant(
        "verify-quarantine-owned-by-the-plan-not-the-run",
        "verify gives a run's quarantine folder an owner only while the run is open or as the shown plan's run",
        (
            Edit(
                "include/tidemark/output/audit.py",
                "run_id in claims.open_runs or (run_id, plan_id) in claims.shown_runs",
                "run_id in claims.open_runs or plan_id in claims.shown_plans",
            ),
        ),
        (
            "tests/unit/runs/test_verify.py::"
            "test_a_runs_quarantine_folder_is_the_runs_while_open_and_the_plans_once_shown_as_that_run_published_it",
        ),
    ),
    Mutant(
        "verify-staging-lock-by-prefix",
        "verify owns a staging folder and its lock by the run id up to the first dot, never by a prefix",
        (
            Edit(
                "include/tidemark/output/audit.py",
                'return "staging" if parts[1].split(".", 1)[0] in claims.open_runs | claims.open_plans else None',
                'return "staging" if any(parts[1].startswith(i) for i in claims.open_runs | claims.open_plans) '
                "else None",
            ),
        ),
        ("tests/unit/runs/test_verify.py::test_a_runs_staging_folder_and_its_lock_are_the_runs_while_it_is_open",),
    ),
    Mutant(
        "verify-iceberg-redrive-rows-as-plans",
        "verify tells an Iceberg table's re-driven rows from the plans' by the snapshot that added their file",
        (
            Edit(
                "include/tidemark/output/audit.py",
                "    added = _added_by(table) if redrives else {}\n",
                "    added: dict[str, int] = {}\n",
            ),
        ),
        ("tests/integration/runs/test_verify.py::test_an_iceberg_feed_verifies_clean_after_a_redrive",),
    ),
    Mutant(
        "parquet-value-folder-named-as-the-column",
        "a Parquet folder of a field's own value is <field>_value=, beside the column, never the column's name",
        (
            Edit(
                "include/tidemark/output/partitioning.py",
                '        derived = f"{choice.field}{VALUE_FOLDER_SUFFIX}"',
                "        pass",
            ),
        ),
        (
            "tests/integration/output/test_value_partitioning.py::"
            "test_parquet_partition_values_read_back_exactly_with_pyarrow_and_spark",
        ),
    ),
    Mutant(
        "parquet-value-column-only-in-the-folder",
        "a Parquet output partitioned by a field's value keeps the column in the files (the folder is a copy)",
        (
            Edit(
                "include/tidemark/output/parquet.py",
                "            good = good.withColumn(f.name, folder_value(f, schema))\n",
                "            good = good.withColumnRenamed(f.column, f.name) if f.identity else good.withColumn(\n"
                "                f.name, folder_value(f, schema))\n",
            ),
        ),
        (
            "tests/integration/output/test_value_partitioning.py::"
            "test_parquet_partition_values_read_back_exactly_with_pyarrow_and_spark",
        ),
    ),
    Mutant(
        "parquet-value-empty-string-in-the-null-folder",
        "a Parquet output's empty string has its own folder (__TIDEMARK_EMPTY_STRING__), never null's",
        (
            Edit(
                "include/tidemark/output/parquet.py",
                "            good = good.withColumn(f.name, folder_value(f, schema))\n",
                "            good = good.withColumn(f.name, good[f.column].cast('string') if f.identity else "
                "folder_value(f, schema))\n",
            ),
        ),
        (
            "tests/integration/output/test_value_partitioning.py::"
            "test_parquet_partition_values_read_back_exactly_with_pyarrow_and_spark",
        ),
    ),
    Mutant(
        "team-membership-not-asked",
        "a feed whose file names a team answers only to that team's members, in the view and at the shared DAGs",
        (
            Edit(
                "include/tidemark/orchestration/access.py",
                "        and (wanted.get(name) is None or in_team(auth_manager, user, str(wanted[name])))\n",
                "        and (wanted.get(name) is None or True)\n",
            ),
        ),
        (
            "tests/integration/web/test_web_access.py::"
            "test_a_user_with_rights_on_both_dags_reaches_only_its_teams_feed[erin-alpha-beta]",
            "tests/dags/test_run_access.py::test_a_feed_of_another_team_is_refused_though_its_dag_rights_allow",
        ),
    ),
    Mutant(
        "team-fab-any-role",
        "under FAB (no teams in the auth manager) a user is in a team only with a role of the team's name",
        (
            Edit(
                "include/tidemark/orchestration/access.py",
                'return team in {getattr(role, "name", None) for role in getattr(user, "roles", None) or ()}',
                'return bool(getattr(user, "roles", None))',
            ),
        ),
        ("tests/dags/test_run_access.py::test_a_team_under_fab_is_a_role_of_that_name",),
    ),
    Mutant(
        "team-not-read-by-the-shared-dags",
        "the shared DAGs' first task reads the feed's team from its file",
        (
            Edit(
                "include/tidemark/orchestration/dags.py",
                "        return load_feed(feed_name).team\n",
                "        return None\n",
            ),
        ),
        ("tests/dags/test_run_access.py::test_a_feed_of_another_team_is_refused_though_its_dag_rights_allow",),
    ),
    Mutant(
        "plain-json-fraction-as-integer",
        "the read tasks stage a JSON record only where Spark's from_json reads it as is (an integer field's "
        "fraction is a bad record)",
        (
            Edit(
                "include/tidemark/spark/arrow_plain.py",
                "        ok = type(value) is int and -(2**63) <= value < 2**63\n",
                "        ok = type(value) in (int, float) and -(2**63) <= value < 2**63\n",
            ),
        ),
        ("tests/unit/spark/test_arrow_plain.py::test_edge_values_are_staged_as_spark_decodes_them_or_refused",),
    ),
    Mutant(
        "plain-json-duplicate-key-kept",
        "the read tasks give way on a JSON object that names a key twice (which value a parser keeps is its own)",
        (Edit("include/tidemark/spark/arrow_plain.py", "    if len(doc) != len(pairs):", "    if False:"),),
        ("tests/unit/spark/test_arrow_plain.py::test_edge_values_are_staged_as_spark_decodes_them_or_refused",),
    ),
    Mutant(
        "output-schema-carrier-sorts-last",
        "a Parquet output's schema file sorts before every plan folder, so pyarrow's dataset reads the whole output "
        "with the output's one schema",
        (
            Edit(
                "include/tidemark/output/output_schema.py",
                'CARRIER_NAME = "output-schema.parquet"',
                'CARRIER_NAME = "schema.parquet"',
            ),
        ),
        (
            "tests/unit/output/test_output_schema.py::test_the_recorded_schema_is_what_pyarrow_s_dataset_reads_the_whole_"
            "output_with",
        ),
    ),
    Mutant(
        "output-schema-decimal-any-scale",
        "a Parquet output widens a decimal only where every value stays exact; a lower scale is a conflict",
        (
            Edit(
                "include/tidemark/output/output_schema.py",
                "return bool(wide.scale >= narrow.scale and wide.precision",
                "return bool(wide.precision",
            ),
        ),
        ("tests/unit/output/test_output_schema.py::test_any_other_type_change_is_a_conflict_naming_the_column",),
    ),
    Mutant(
        "output-schema-change-not-refused",
        "schema_change other than evolve refuses any change of a Parquet output's schema, naming it",
        (Edit("include/tidemark/output/parquet.py", '    if policy != "evolve":\n', '    if policy == "never":\n'),),
        (
            "tests/unit/output/test_output_schema.py::test_a_change_is_refused_unless_the_feed_evolves_and_a_conflict_"
            "always",
        ),
    ),
    Mutant(
        "output-schema-plan-not-conformed",
        "a plan whose reader lacks a column of the output or holds it narrower is written with the output's schema",
        (Edit("include/tidemark/output/parquet.py", "    if evolution.conform:\n", "    if not evolution:\n"),),
        (
            "tests/integration/job/test_output_schema.py::test_a_writer_change_evolves_the_output_s_one_schema_read_"
            "whole_by_pyarrow_and_spark[int_to_long]",
        ),
    ),
    Mutant(
        "avro-decimal-rescale-skipped",
        "an Avro decimal read at a higher scale is decoded at the writer's scale, then cast: every value exact",
        (Edit(AVRO, "        rescaled = rescaled_reader(schemas.reader, writer)\n", "        rescaled = None\n"),),
        (
            "tests/integration/job/test_payload_fidelity.py::test_avro_decimal_read_at_a_higher_scale_publishes_every_value_"
            "exactly",
        ),
    ),
    Mutant(
        "avro-decimal-lower-scale-accepted",
        "an Avro decimal read at a lower scale than written is refused (a value may have no exact reader value)",
        (
            Edit(
                AVRO,
                "return bool(mine.getScale() > theirs.getScale() and integer_digits)",
                "return bool(integer_digits)",
            ),
        ),
        (
            "tests/integration/spark/test_avro_resolution.py::test_a_decimal_resolves_at_its_scale_with_at_least_its_"
            "precision",
        ),
    ),
    Mutant(
        "avro-quarantine-policy-ignored",
        "schema_change: quarantine sets an unresolvable writer's records aside with the reason instead of failing",
        (
            Edit(
                AVRO, 'if problem is not None and feed.schema_change == "quarantine":', "if problem is None and False:"
            ),
        ),
        (
            "tests/integration/job/test_output_schema.py::test_schema_change_quarantine_sets_an_incompatible_writers_"
            "records_aside_with_the_reason",
        ),
    ),
    Mutant(
        "redrive-run-apart-from-the-feeds-runs",
        "a re-drive is a run of the feed (its row under the feed's name): the feed's next run settles it",
        (
            Edit(
                "include/tidemark/runs/redrive.py",
                "    store.plan_redrive(feed.group, run.handle.run_id, feed=feed.name,",
                '    store.plan_redrive(feed.group, run.handle.run_id, feed=f"{feed.name}:redrive",',
            ),
        ),
        (
            "tests/integration/runs/test_redrive_lifecycle.py::"
            "test_a_redrive_killed_before_its_bookkeeping_is_settled_by_the_next_scheduled_run_once"
            "[redrive.after_stage-parquet-raise]",
        ),
    ),
    Mutant(
        "redrive-unstaged-left-open-for-good",
        "a re-drive that staged nothing is given up once another re-drive showed one of its letters",
        (
            Edit(
                "include/tidemark/runs/protocol.py",
                "    if plan.letters:\n        taken = letters_taken(",
                "    if False:\n        taken = letters_taken(",
            ),
        ),
        (
            "tests/unit/runs/test_protocol_model.py::"
            "test_a_redrive_that_died_before_staging_is_given_up_once_another_showed_its_letters",
        ),
    ),
    Mutant(
        "redrive-letters-outside-the-plan-id",
        "a re-drive plan's id is the hash of its letters, checked when its plan is read back",
        (
            Edit(
                "include/tidemark/planning/plan.py",
                '            redrive_plan_id(plan.feed, plan.letters) if plan.mode == "redrive"',
                '            plan.plan_id if plan.mode == "redrive"',
            ),
        ),
        ("tests/unit/planning/test_redrive_plan.py::test_a_redrive_plans_letters_are_its_id_and_an_edit_is_refused",),
    ),
    Mutant(
        "changes-delete-marker-pruned-below-every-clock-whatever-its-order",
        "a deleted key's marker is kept for good unless a change below its partition's clock never applies "
        "(issue 58: a restarted worker's re-sent insert, ordered by its LSN alone, must not bring the key back)",
        (Edit(CHANGES, "if not (m[0] and m[0][0] in prunable)}  # for good", "if False}"),),
        (RE_SENT_TEST + "[lsn]",),
    ),
    Mutant(
        "changes-re-sent-change-below-the-clock-applied",
        "a PostgreSQL change ordered by source.sequence and below its partition's clock was sent again: it is stale "
        "(issue 58: else a re-sent insert brings back a key whose marker was pruned)",
        (Edit(CHANGES, "        if re_sent(c, here):\n", "        if False:\n"),),
        (RE_SENT_TEST + "[sequence]",),
    ),
    Mutant(
        "verify-plan-scope-reads-the-whole-log",
        "a verify scoped to a plan reads from Kafka only the plan's ranges (a run costs what it reads)",
        (
            Edit(
                VERIFY,
                "            start, stop = max(start, scope[tp][0]), min(ends.get(tp, 0), scope[tp][1])\n",
                "            pass\n",
            ),
        ),
        (f"{VERIFY_TEST}test_a_verify_scoped_to_a_plan_reads_only_its_ranges_and_names_the_faults_inside_them",),
    ),
    Mutant(
        "verify-plan-scope-end-inclusive",
        "a verify scoped to a plan reads its ranges [start, end): the end is the next plan's",
        (
            Edit(
                VERIFY,
                "min(ends.get(tp, 0), scope[tp][1])\n",
                "min(ends.get(tp, 0), scope[tp][1] + 1)\n",
            ),
        ),
        (f"{VERIFY_TEST}test_a_verify_scoped_to_a_plan_reads_only_its_ranges_and_names_the_faults_inside_them",),
    ),
    Mutant(
        "verify-plan-scope-start-exclusive",
        "a verify scoped to a plan reads its ranges [start, end): the start is the plan's",
        (
            Edit(
                VERIFY,
                "            start, stop = max(start, scope[tp][0]), ",
                "            start, stop = max(start, scope[tp][0] + 1), ",
            ),
        ),
        (f"{VERIFY_TEST}test_a_verify_scoped_to_a_plan_reads_only_its_ranges_and_names_the_faults_inside_them",),
    ),
    Mutant(
        "verify-plan-scope-reads-only-publications-inside-it",
        "a verify scoped to a plan reads the rows of every publication whose recorded ranges meet the plan's",
        (
            Edit(
                "include/tidemark/output/audit.py",
                "        if span is not None and r.start < span[1] and span[0] < r.end:\n",
                "        if span is not None and span[0] <= r.start and r.end <= span[1]:\n",
            ),
        ),
        (f"{VERIFY_TEST}test_a_verify_scoped_to_a_plan_finds_a_duplicate_in_a_plan_overlapping_it_by_one_offset",),
    ),
    Mutant(
        "verify-plan-scope-offsets-not-clipped",
        "a verify scoped to a plan checks the offsets inside the plan's ranges only",
        (
            Edit(
                VERIFY,
                "    if scope is None:\n        return dict(parts)\n",
                "    if True:\n        return dict(parts)\n",
            ),
        ),
        (f"{VERIFY_TEST}test_a_verify_scoped_to_a_plan_finds_a_duplicate_in_a_plan_overlapping_it_by_one_offset",),
    ),
    Mutant(
        "verify-plan-scope-ledger-whole",
        "a verify scoped to a plan looks for its own plan's publication only",
        (Edit(VERIFY, "        if report.plan is not None and row.plan_id != report.plan:\n", "        if False:\n"),),
        (f"{VERIFY_TEST}test_a_verify_scoped_to_a_plan_finds_a_duplicate_in_a_plan_overlapping_it_by_one_offset",),
    ),
    Mutant(
        "verify-dag-task-audits-the-whole-feed",
        "the feed DAG's verify task audits its run's plan only",
        (
            Edit(
                "include/tidemark/orchestration/dags.py",
                '                             progress=log.info, plan=handle["plan_id"])  # fmt: skip\n',
                "                             progress=log.info)  # fmt: skip\n",
            ),
        ),
        (f"{VERIFY_TEST}test_the_feed_dags_verify_task_audits_its_runs_plan_only",),
    ),
)


@dataclass
class Outcome:
    mutant: str
    breaks: str
    tests: list[str]
    red: list[str]
    passed: list[str]
    errored: list[str] = field(default_factory=list)
    raised: list[str] = field(default_factory=list)  # died of an exception no assertion of the test named
    error: str | None = None
    seconds: float = 0.0

    @property
    def caught(self) -> bool:
        return self.error is None and bool(self.red)


def copy_tree(target: Path) -> None:
    """The working tree as it is (tracked and untracked, not ignored files) into ``target``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.is_file():  # deleted in the working tree
            continue
        dest = target / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)


def apply(target: Path, edits: tuple[Edit, ...]) -> None:
    for edit in edits:
        path = target / edit.path
        text = path.read_text()
        found = text.count(edit.old)
        if found != 1:
            raise RuntimeError(f"{edit.path}: the text to break occurs {found} times, not once: {edit.old!r}")
        path.write_text(text.replace(edit.old, edit.new))


def environment(target: Path, tests: tuple[str, ...]) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target / "include"), str(target)])}
    if any(t.startswith("tests/faults") for t in tests):
        env.pop("TIDEMARK_TEST_KAFKA_HOME", None)  # the fault suite stops brokers: its own cluster
    return env


_LOCATION = re.compile(r"^(?P<path>\S+?):(?P<line>\d+): (?P<what>\S+)$", re.M)
_ASSERTING = ("AssertionError", "Failed")  # an assert, pytest.fail / pytest.raises that saw nothing / a timeout


def classify(message: str, text: str) -> str:
    """``assertion`` or ``raised``: how a JUnit ``<failure>`` (its ``message`` attribute, its traceback text) ended.

    An assertion is an ``AssertionError`` (pytest's rewritten ``assert`` reports ``assert ...``) or
    pytest's ``Failed`` (``pytest.fail``, ``pytest.raises`` that saw no exception, pytest-timeout's
    ``Timeout``) whose innermost frame is outside the ``tidemark`` package: the test said what it
    expected. Anything else (a product exception out of the test's body, an ``assert`` inside
    ``tidemark``) is ``raised``: the test did not say that this was wrong.
    """
    head = message.strip().splitlines()[0] if message.strip() else ""
    kind = "AssertionError" if head.startswith("assert ") or head == "assert" else head.split(":", 1)[0].strip()
    if kind.rsplit(".", 1)[-1] not in _ASSERTING:
        return "raised"
    if kind.rsplit(".", 1)[-1] == "Failed" and head.split(":", 1)[-1].strip().startswith("Timeout"):
        return "assertion"  # pytest-timeout stops a breakage that hangs: the mutant's own timeout_s says so
    where = _LOCATION.findall(text)
    innermost = where[-1][0].replace("\\", "/") if where else ""
    in_product = "/tidemark/" in f"/{innermost}" and "/tests/" not in f"/{innermost}"
    return "raised" if in_product else "assertion"


def read_report(report: Path) -> tuple[list[str], list[str], list[str], list[str]]:
    """(failed on an assertion, passed, errored, raised) node ids of one pytest JUnit XML report."""
    red: list[str] = []
    passed: list[str] = []
    errored: list[str] = []
    raised: list[str] = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        failure = case.find("failure")
        if case.find("error") is not None:
            errored.append(name)  # setup or teardown broke: says nothing about the guarantee
        elif failure is not None:
            verdict = classify(failure.get("message", ""), failure.text or "")
            (red if verdict == "assertion" else raised).append(name)
        elif case.find("skipped") is None:
            passed.append(name)
    return red, passed, errored, raised


def run_tests(
    target: Path, tests: tuple[str, ...], report: Path, timeout_s: int | None = None
) -> tuple[list[str], list[str], list[str], list[str]]:
    """(failed on an assertion, passed, errored, raised) node ids of one pytest run in ``target``."""
    env = environment(target, tests)
    where = subprocess.run(
        [sys.executable, "-c", "import tidemark; print(tidemark.__file__)"],
        cwd=target, env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    if not where.startswith(str(target)):
        raise RuntimeError(f"the scratch copy's tidemark is not the one imported ({where})")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={report}", *tests]
    if timeout_s is not None:
        cmd.append(f"--timeout={timeout_s}")
    subprocess.run(cmd, cwd=target, env=env, check=False)
    return read_report(report)


def run_mutant(mutant: Mutant | None, tests: tuple[str, ...], keep: bool) -> Outcome:
    name = mutant.name if mutant else "baseline (unbroken)"
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix=f"tidemark-mutant-{mutant.name if mutant else 'baseline'}-"))
    outcome = Outcome(name, mutant.breaks if mutant else "", list(tests), [], [])
    try:
        copy_tree(scratch)
        if mutant is not None:
            apply(scratch, mutant.edits)
        timeout_s = mutant.timeout_s if mutant else None
        outcome.red, outcome.passed, outcome.errored, outcome.raised = run_tests(
            scratch, tests, scratch / "junit.xml", timeout_s
        )
        if not (outcome.red or outcome.passed or outcome.errored or outcome.raised):
            outcome.error = "none of its tests ran"
    except (RuntimeError, subprocess.CalledProcessError, ET.ParseError, OSError) as exc:
        outcome.error = str(exc)
    finally:
        outcome.seconds = round(time.monotonic() - started, 1)
        if keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return outcome


def table(outcomes: list[Outcome]) -> str:
    rows = [
        "| mutant | breaks | failed on an assertion | raised or errored (not counted) | caught | s |",
        "|---|---|---|---|---|---:|",
    ]
    for o in outcomes:
        red = ", ".join(f"`{t}`" for t in o.red) or "none"
        apart = ", ".join([*(f"`{t}` (raised)" for t in o.raised), *(f"`{t}` (errored)" for t in o.errored)])
        verdict = f"NO ({o.error})" if o.error else ("yes" if o.red else "NO (survived)")
        rows.append(f"| {o.mutant} | {o.breaks} | {red} | {apart or 'none'} | {verdict} | {o.seconds:.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--only", nargs="*", help="run only these mutants (by name)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the selected tests unbroken")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = set(args.only or ()) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"no mutant named {sorted(unknown)}; known: {[m.name for m in MUTANTS]}")
    if not args.no_baseline:
        tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        base = run_mutant(None, tests, args.keep)
        if base.red or base.errored or base.raised or base.error:
            print(table([base]))
            print(f"baseline not green: {base.red or base.raised or base.errored or base.error}; fix that first")
            return 2
    outcomes = [run_mutant(m, m.tests, args.keep) for m in chosen]
    print()
    print(table(outcomes))
    survived = [o.mutant for o in outcomes if not o.caught]
    # With --only, the other mutants keep their last recorded outcome; mutants no longer listed are dropped.
    known = {m["mutant"]: m for m in json.loads(LAST_RUN.read_text())["mutants"]} if LAST_RUN.exists() else {}
    known.update({o.mutant: {**vars(o), "caught": o.caught} for o in outcomes})
    recorded = [known[m.name] for m in MUTANTS if m.name in known]
    LAST_RUN.write_text(
        json.dumps(
            {"mutants": recorded, "survived": [m["mutant"] for m in recorded if not m["caught"]]},
            indent=2, sort_keys=True,
        ) + "\n"
    )  # fmt: skip
    tail = f"; survived: {survived}" if survived else ""
    print(f"{len(outcomes) - len(survived)} of {len(outcomes)} mutants caught{tail}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
