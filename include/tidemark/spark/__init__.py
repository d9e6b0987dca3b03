"""Spark plumbing of the job, and the few pieces the pipeline hands to ``spark-submit``.

``session`` builds the SparkSession and the configuration every Tidemark application sets
(the pipeline's too); ``secrets`` hands the connections to the driver in a private file;
``source`` is the Kafka data source that reads exactly a plan's ranges, ``stats`` the
per-range statistics of what it read; ``decode`` decodes keys and values (the record
columns it adds are named in ``columns``); a Schema Registry format (``avro``,
``json_schema``, ``protobuf``, over the wire format's ``wire``) implements the protocol of
``formats``, through which ``decode`` finds it by name; ``arrow_avro`` stages Avro records
in the read tasks themselves.
"""
