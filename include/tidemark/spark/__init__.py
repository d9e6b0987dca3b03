"""Spark plumbing used inside the job: the session, the Kafka data source and record decoding."""
