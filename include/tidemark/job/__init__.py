"""The spark-submit program: read a plan from Kafka, stage, validate, publish, write the job's result."""
