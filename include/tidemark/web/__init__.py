"""The Tidemark view: a FastAPI app over the run reports, mounted by the Airflow plugin."""
