"""Offline Spark pipelines over mqlake's native store files: tiering to Delta, index rebuild, replay."""
