"""Masking benchmark: what hashing a sensitive field costs with the key kept out of Spark's plans.

``python -m tests.bench.masking [--rows N] [--rounds R]`` builds ``--rows`` decoded records
in a local Spark session (an email at the top level, a note in an array of records) and
times, side by side in each round, a ``noop`` write of the records hashed:

- **plan literal**: Spark's ``hmac`` with the key as a literal (in every plan string);
- **UDF**: :func:`tidemark.spark.masking.mask_records` (the key in a Python UDF's closure only).

The order alternates between rounds; one warm-up round is dropped. Printed: each case's
median seconds and the ratio UDF / literal of the medians, for the top-level field and for
the field under the array. Not a test; no Kafka needed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from tidemark.config.masking import Masking
from tidemark.spark.masking import mask_records
from tidemark.spark.session import local_session

KEY = b"a-benchmark-masking-key-0123456789"


def literal_hash(column: Any) -> Any:
    """The hash as Spark's own ``hmac`` computes it, the key a literal of the plan."""
    from pyspark.sql import functions as F

    return F.when(column.isNotNull(), F.lower(F.hex(F.hmac(F.lit(KEY), column.cast("binary")))))


def records(spark: Any, rows: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(rows).select(
        F.col("id"),
        F.concat(F.lit("user-"), F.col("id").cast("string"), F.lit("@example.com")).alias("email"),
        F.array(F.struct(F.concat(F.lit("note "), F.col("id").cast("string")).alias("note"))).alias("items"),
    )


def cases(frame: Any) -> dict[str, dict[str, Callable[[], Any]]]:
    from pyspark.sql import functions as F

    return {
        "top-level field": {
            "literal": lambda: frame.withColumn("email", literal_hash(F.col("email"))),
            "udf": lambda: mask_records(frame, Masking(fields={"email": "hash"}), KEY, "bench"),
        },
        "field in an array of records": {
            "literal": lambda: frame.withColumn(
                "items", F.transform("items", lambda i: i.withField("note", literal_hash(i.getField("note"))))
            ),
            "udf": lambda: mask_records(frame, Masking(fields={"items.note": "hash"}), KEY, "bench"),
        },
    }


def timed(build: Callable[[], Any]) -> float:
    started = time.perf_counter()
    build().write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.bench.masking", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    spark = local_session("tidemark-bench-masking")
    frame = records(spark, args.rows).cache()
    frame.count()
    results: dict[str, Any] = {"rows": args.rows, "rounds": args.rounds, "cases": {}}
    for name, pair in cases(frame).items():
        times: dict[str, list[float]] = {"literal": [], "udf": []}
        for round_ in range(args.rounds + 1):
            order = ("literal", "udf") if round_ % 2 == 0 else ("udf", "literal")
            measured = {which: timed(pair[which]) for which in order}
            if round_:  # the first round warms up the JVM and the Python workers
                for which, seconds in measured.items():
                    times[which].append(seconds)
        medians = {which: statistics.median(values) for which, values in times.items()}
        results["cases"][name] = {**{f"{k}_median_s": round(v, 3) for k, v in medians.items()},
                                  "ratio_udf_over_literal": round(medians["udf"] / medians["literal"], 2),
                                  "times": times}  # fmt: skip
        print(f"{name}: literal {medians['literal']:.2f}s, UDF {medians['udf']:.2f}s, "
              f"ratio {medians['udf'] / medians['literal']:.2f}")  # fmt: skip
    print(json.dumps(results))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
