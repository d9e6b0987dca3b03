"""Local stand-ins for `make demo` and `make airflow` (the embedded Kafka cluster, a local Airflow).

No runtime module imports this package; the CLI's dev commands and the demo do."""
