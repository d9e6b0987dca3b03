"""Tidemark's Airflow DAGs: one per feed in the feeds folder, plus backfill and replay.

Each feed file in `include/feeds/` (or `TIDEMARK_FEEDS_DIR`) becomes a DAG named
`tidemark_<feed>` on the feed's schedule. `tidemark_backfill` reads a timestamp window
and `tidemark_replay` re-reads from any start; both are triggered from the UI's form.
The DAGs are built by `tidemark.orchestration.dags`; this file only registers them.
"""

from __future__ import annotations

from tidemark.orchestration.dags import all_dags

globals().update(all_dags())
