"""Local PostgreSQL, s3proxy and Spark standalone servers started by the test fixtures."""
