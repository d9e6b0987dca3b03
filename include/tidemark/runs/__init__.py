"""One run outside Spark (CLI and Airflow tasks): plan, submit the job, commit, report, status."""
