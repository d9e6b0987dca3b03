"""Tidemark's feed files that load no DAG, shown as this file's Airflow import error.

`tidemark_dags.py` loads every good feed file on its own; a feed file that is not valid
YAML, not a valid feed, or whose DAG id collides with another feed's or a built-in DAG's
gets no DAG there. This file then fails to import, naming each such file, its field and
the remedy, so the bad feed shows in the UI's import errors instead of silently missing.
"""

from __future__ import annotations

from tidemark.orchestration.dags import check_feed_files

check_feed_files()
