"""Where the tier keeps its Delta tables under a lake root: the names the tier job writes and the broker reads."""

from __future__ import annotations

from pathlib import Path

MESSAGES = "messages"  # one row per tiered record (pipelines/schema.py), by broker name, topic and UTC store date
SEGMENTS = "segments"  # one row per tiered CommitLog segment, with the queue offset ranges it held
STORE_DATE = "store_date"  # UTC date of store_timestamp: partitions close at UTC midnight
BROKER_NAME = "broker_name"  # the broker group whose store a row came from: first partition of messages


def table_uri(lake: str | Path, name: str) -> str:
    """The table's location: ``lake/name``, absolute for a local lake, as is for an ``s3://`` one."""
    if str(lake).startswith("s3://"):
        return f"{str(lake).rstrip('/')}/{name}"
    return str(Path(lake).absolute() / name)
