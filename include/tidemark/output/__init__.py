"""Where a plan is published: one publisher interface, with Parquet and Iceberg behind it."""
