"""Airflow: the DAG factories, the connections and the Spark operator. The only Airflow importer."""
