"""The Kafka adapter: connection settings and thin typed calls over confluent-kafka."""
