"""Spark pipelines over the native store: tiering to Delta, index verification, replay."""
