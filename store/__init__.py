"""mqlake's native store: RocketMQ's CommitLog, ConsumeQueue, IndexFile and friends, byte for byte.

Importable on its own: no network, no Spark.
"""
