"""Spark fixtures: one session-scoped SparkSession for the whole suite (owned by the Spark pipelines work)."""
