"""Re-drive's Spark work as a ``spark-submit`` job: the re-check, and the staging of the passing dead letters.

A run's job reads a plan; a re-drive's reads dead letters the submitting side chose
(:mod:`tidemark.runs.redrive`). The two sides talk through a private folder (0700, on the
submitting host, as the secrets file: the driver in client deploy mode reads it), holding
:data:`REQUEST_FILE` (which phase, the feed, and for ``stage`` the re-drive's plan and run
id) and :data:`LETTERS_FILE` (the dead letters, for ``stage`` those the re-drive took, raw
bytes as base64); the job writes :data:`ANSWER_FILE` (each dead letter's verdict, or the error) in
every case and exits non-zero on any failure. Two phases, each a job of its own, because the
re-drive's record and ledger row are written between them, on the submitting side:

1. ``recheck``: the dead letters through :func:`tidemark.job.redrive.recheck`; the answer is
   their verdicts;
2. ``stage``: the dead letters the record took, re-checked again (a schema registered in
   between may change a verdict: then the job fails and stages nothing) and staged pending
   under the re-drive's run id (:func:`tidemark.job.redrive.stage_passing`).

:class:`RedriveJob` is the submitting side's handle on it: it writes the folder, has the job
submitted (the CLI's ``spark-submit``, or the Spark provider's hook in the DAG) and reads the
answer. A failed ``stage`` job raises :class:`RedriveJobError` and leaves the re-drive's row
and whatever it staged as a crash after staging leaves them, for the next re-drive to settle.
``spark_jobs/tidemark_redrive.py`` is the thin entry point around :func:`main`.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from tidemark.config.models import Feed, load_feed
from tidemark.errors import ConfigError, PublishError, TidemarkError
from tidemark.job.entry import SHIP_ENV, _ship_setting, root_cause, session, ship_package, should_ship
from tidemark.job.redrive import Verdict, recheck, stage_passing, staged_result
from tidemark.job.result import JobResult, write_result
from tidemark.output import publisher_for
from tidemark.output.deadletters import DeadLetter, Key
from tidemark.planning.plan import Plan
from tidemark.spark.secrets import load_secrets
from tidemark.storage import Location

REQUEST_FILE = "request.json"
LETTERS_FILE = "letters.json"
ANSWER_FILE = "answer.json"
LOG_FILE = "spark-submit.log"  # the submitter's log of the job, when it keeps one (the CLI does)


class RedriveJobError(TidemarkError):
    """The re-drive's Spark job failed: nothing it did is shown; a staged publication waits for the next re-drive."""


# (the job's folder, its dead letters' count) -> None once the job exited 0; raises when it did not.
SubmitJob = Callable[[Path, int], None]


@dataclass(frozen=True)
class RedriveJob:
    """The re-drive's Spark work through ``submit`` (a ``spark-submit`` of ``spark_jobs/tidemark_redrive.py``)."""

    submit: SubmitJob
    where: str = ""  # where the job is submitted (a master, a connection), for its errors

    def recheck(self, feed: Feed, letters: Sequence[DeadLetter]) -> tuple[Verdict, ...]:
        """``letters``' verdicts, as :func:`tidemark.job.redrive.recheck` gives them, from a job."""
        if not letters:
            return ()
        answer = self._run({"phase": "recheck", "feed": feed.name}, letters)
        return verdicts_of(letters, answer)

    def stage(self, feed: Feed, plan: Plan, letters: Sequence[DeadLetter], *, run_id: str, run_dir: Location) -> None:
        """Stage ``letters`` (those the re-drive plan ``plan`` claims) as its publication, pending for run ``run_id``,
        in a job; the job's result goes into the run dir's ``job.json``, its log beside it (when the submitter keeps
        one)."""
        request = {"phase": "stage", "feed": feed.name, "plan": plan.to_dict(), "run_id": run_id}
        answer = self._run(request, letters, run_dir / LOG_FILE)
        if "result" not in answer:  # it exited 0 and wrote nothing here: its driver never saw this folder
            raise RedriveJobError(
                f"the re-drive's Spark job (stage, {len(letters)} dead letters of feed '{feed.name}') gave no answer "
                "in its folder on this machine: its driver must run here (client deploy mode); the re-drive stays "
                "open and the feed's next run settles it"
            )
        write_result(run_dir, JobResult.from_dict(answer["result"]))

    def _run(self, request: Mapping[str, Any], letters: Sequence[DeadLetter],
             log: Location | None = None) -> dict[str, Any]:  # fmt: skip
        with job_folder() as folder:
            write_request(folder, request, letters)
            try:
                self.submit(folder, len(letters))
            except Exception as exc:
                _keep_log(folder, log)
                answer = read_answer(folder)
                why = answer.get("error") or str(exc)
                raise RedriveJobError(
                    f"the re-drive's Spark job ({request['phase']}, {len(letters)} dead letters of feed "
                    f"'{request['feed']}'{', ' + self.where if self.where else ''}) failed: {why}"
                ) from exc
            _keep_log(folder, log)
            answer = read_answer(folder)
        if answer.get("error"):  # a submitter that does not see the exit status
            raise RedriveJobError(f"the re-drive's Spark job ({request['phase']}) failed: {answer['error']}")
        return answer


def _keep_log(folder: Path, log: Location | None) -> None:
    if log is not None and (folder / LOG_FILE).exists():
        log.write_text((folder / LOG_FILE).read_text())


@contextmanager
def job_folder() -> Iterator[Path]:
    """A new folder readable by this user only (``tempfile.mkdtemp``: 0700), removed when the block ends."""
    folder = Path(tempfile.mkdtemp(prefix="tidemark-redrive-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _encode(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return {"b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, datetime):
        return {"time": value.isoformat()}
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        return base64.b64decode(value["b64"]) if "b64" in value else datetime.fromisoformat(value["time"])
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    return value


def write_request(folder: Path, request: Mapping[str, Any], letters: Sequence[DeadLetter]) -> None:
    """The job's input: ``request`` and ``letters`` (every field of each, bytes and times tagged)."""
    (folder / REQUEST_FILE).write_text(json.dumps(dict(request)))
    docs = [{f.name: _encode(getattr(d, f.name)) for f in fields(DeadLetter)} for d in letters]
    (folder / LETTERS_FILE).write_text(json.dumps(docs))


def read_letters(folder: Path) -> list[DeadLetter]:
    """The dead letters :func:`write_request` wrote."""
    docs = json.loads((folder / LETTERS_FILE).read_text())
    return [DeadLetter(**{k: _decode(v) for k, v in doc.items()}) for doc in docs]


def read_answer(folder: Path) -> dict[str, Any]:
    """The job's answer; an empty one when the job wrote none (it died before its ``finally``)."""
    path = folder / ANSWER_FILE
    answer: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return answer


def verdicts_of(letters: Sequence[DeadLetter], answer: Mapping[str, Any]) -> tuple[Verdict, ...]:
    """``letters``' verdicts as the job's answer gives them (by the dead letter's key)."""
    found: dict[Key, tuple[bool, tuple[str, ...], str]] = {
        (str(k[0]), str(k[1]), int(k[2]), int(k[3])): (bool(passes), tuple(codes), str(reason))
        for k, passes, codes, reason in answer.get("verdicts", [])
    }
    missing = [d.key_of for d in letters if d.key_of not in found]
    if missing:
        p, t, n, o = missing[0]
        raise RedriveJobError(f"the re-drive's Spark job gave no verdict for {len(missing)} dead letters (the first "
                              f"{t}[{n}] offset {o} of plan {p}); see its log")  # fmt: skip
    return tuple(Verdict(d, *found[d.key_of]) for d in letters)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tidemark_redrive", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--work", required=True, help=f"the folder with {REQUEST_FILE} and {LETTERS_FILE}")
    parser.add_argument(
        "--ship-package",
        action="store_true",
        default=_ship_setting(os.environ.get(SHIP_ENV, "")),
        help="zip the tidemark package for the executors (default: when the master is not local)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one phase; 0 on success, 1 on any failure (with :data:`ANSWER_FILE` saying why)."""
    args = parse_args(argv)
    folder = Path(args.work)
    answer: dict[str, Any] = {}
    try:
        load_secrets()  # the connections, handed over in a private file (tidemark.spark.secrets), first
        request = json.loads((folder / REQUEST_FILE).read_text())
        feed = load_feed(str(request["feed"]))
        letters = read_letters(folder)
        spark = session(f"tidemark-redrive-{feed.name}", avro=feed.deserialization.decodes_avro)
        if should_ship(spark.sparkContext.master, args.ship_package):
            ship_package(spark)
        checked = recheck(spark, feed, letters)
        answer["verdicts"] = [[list(v.letter.key_of), v.passes, list(v.reason_codes), v.reason]
                              for v in checked.verdicts]  # fmt: skip
        if request["phase"] == "stage":
            refused = [v for v in checked.verdicts if not v.passes]
            if refused:
                d = refused[0].letter
                raise PublishError(
                    f"re-drive {request['run_id']}: {len(refused)} of the dead letters it took fail the feed's rules "
                    f"now (the first {d.topic}[{d.partition}] offset {d.offset} of plan {d.plan_id}: "
                    f"{'; '.join(refused[0].reason_codes)}); nothing was staged. Run `tidemark redrive` again"
                )
            plan = Plan.from_dict(request["plan"])  # a re-drive plan: its id checked against its letters
            if plan.mode != "redrive" or sorted(plan.letters) != sorted(d.key_of for d in letters):
                raise ConfigError(f"plan {plan.plan_id} is not a re-drive plan of the dead letters sent")
            manifest = stage_passing(checked, plan, feed, publisher_for(feed), run_id=str(request["run_id"]),
                                     extra={"redrive": {"run_id": str(request["run_id"])}})  # fmt: skip
            answer["result"] = staged_result(plan, manifest).to_dict()
    except Exception as exc:  # noqa: BLE001 - every failure must end as the answer + a non-zero exit
        answer["error_type"], answer["error"] = root_cause(exc)
        print(f"tidemark re-drive job failed: {answer['error_type']}: {answer['error']}", file=sys.stderr)
        if not isinstance(exc, TidemarkError):
            traceback.print_exc()
    finally:
        (folder / ANSWER_FILE).write_text(json.dumps(answer))
    return 1 if answer.get("error") else 0
