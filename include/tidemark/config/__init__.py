"""Feed configuration: the feed YAML files and the typed models they are validated into."""
