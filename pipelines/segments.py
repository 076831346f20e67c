"""CommitLog segments as a Spark source: ``spark.read.format("commitlog").load(path)``.

``path`` is a store root, its ``commitlog`` directory, one segment file or a comma-separated list of
segment files.  Options:

- ``view``: ``messages`` (default; the canonical schema of ``lake/schema.py``) or ``segments``
  (one row of :class:`SegmentFacts` per file).
- ``segments``: comma-separated base offsets to read (others are skipped).
- ``splitSize``: bytes; a segment larger than this is read by several tasks (default 1 GiB, RocketMQ's
  segment size: on 2 cores one task per segment measured faster than 64/128 MiB splits, see
  docs/benchmarks.md; smaller splits pay on clusters with idle cores).  A split
  ``[a, b)`` owns the records that start in it; it finds its first record with
  ``store.format.records.find_record_boundary`` (MAGICCODE + PHYSICALOFFSET equal to its own offset), so the
  driver never reads the files.
- ``onError``: what the ``messages`` view does at a record it cannot decode (bad magic, a size that
  overruns the file, fields that do not add up to the size): ``fail`` (default) raises naming the file
  and position; ``stop`` ends that split there, the rows before it stay, and the ``segments`` view
  reports the error.  A flipped body byte is not an error: the row comes with ``crc_ok = false``.
- ``batchRecords``: records per Arrow batch (default 8192).
- ``brokerName``: the ``messages`` view as rows of the lake's ``messages`` table (``MESSAGES_SCHEMA``): this
  broker's name and the UTC store date appended, as the tier adds them (``lake.columnar.table_rows``).

Zeros where a record would start end a segment quietly: that is the active segment's unwritten tail
(the store writes TOTALSIZE + MAGICCODE last, so a concurrent append is either whole or invisible).

The files are read by pipelines/segment_reader.py, which imports no Spark (replay's and verify-index's local
engines read segments through it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from lake import columnar
from lake.schema import MESSAGE_SCHEMA, MESSAGES_SCHEMA, SEGMENT_FACTS_SCHEMA, spark_schema
from pipelines.segment_reader import (
    DEFAULT_BATCH_RECORDS,
    DEFAULT_SPLIT_SIZE,
    CommitLogSourceError,
    facts_batch,
    read_segment,
    scan_segment,
    segment_files,
)

# =====================================================================================================
# The Spark Python Data Source
# =====================================================================================================


class SegmentSplit(InputPartition):
    """Bytes ``[start, stop)`` of one segment file (the whole file for the segments view)."""

    def __init__(self, path: str, start: int, stop: int) -> None:
        super().__init__((path, start, stop))
        self.path, self.start, self.stop = path, start, stop


def _positive_int(options: dict, name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise CommitLogSourceError(f"commitlog option {name}={raw!r} is not an integer") from None
    if value <= 0:
        raise CommitLogSourceError(f"commitlog option {name}={raw!r} must be positive")
    return value


class CommitLogDataSource(DataSource):
    """``spark.read.format("commitlog")``; see the module docstring for options."""

    @classmethod
    def name(cls) -> str:
        return "commitlog"

    def _options(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.options.items()}  # Spark option names are case-insensitive

    def _view(self) -> str:
        view = self._options().get("view", "messages")
        if view not in ("messages", "segments"):
            raise CommitLogSourceError(f"commitlog option view={view!r}: use 'messages' or 'segments'")
        return view

    def schema(self):
        if self._view() == "segments":
            return spark_schema(SEGMENT_FACTS_SCHEMA)
        return spark_schema(MESSAGES_SCHEMA if self._options().get("brokername") else MESSAGE_SCHEMA)

    def reader(self, schema) -> DataSourceReader:
        return CommitLogReader(self._options(), self._view())


class CommitLogReader(DataSourceReader):
    def __init__(self, options: dict, view: str) -> None:
        path = options.get("path")
        if not path:
            raise CommitLogSourceError('commitlog source needs a path: spark.read.format("commitlog").load(path)')
        # absolute: an executor on a cluster resolves a relative path against its own work dir
        self.files = [str(f.absolute()) for f in segment_files(path)]
        wanted = options.get("segments")
        if wanted:
            try:
                bases = {int(b) for b in wanted.split(",") if b.strip()}
            except ValueError:
                raise CommitLogSourceError(f"commitlog option segments={wanted!r}: expected base offsets") from None
            self.files = [f for f in self.files if int(Path(f).name) in bases]
        self.view = view
        self.broker_name = options.get("brokername")
        if self.broker_name is not None and not self.broker_name:
            raise CommitLogSourceError("commitlog option brokerName is empty")
        self.split_size = _positive_int(options, "splitsize", DEFAULT_SPLIT_SIZE)
        self.batch_records = _positive_int(options, "batchrecords", DEFAULT_BATCH_RECORDS)
        self.on_error = options.get("onerror", "fail")
        if self.on_error not in ("fail", "stop"):
            raise CommitLogSourceError(f"commitlog option onError={self.on_error!r}: use 'fail' or 'stop'")

    def partitions(self) -> Sequence[InputPartition]:
        splits: list[InputPartition] = []
        for f in self.files:
            size = os.stat(f).st_size
            if self.view == "segments" or size <= self.split_size:
                splits.append(SegmentSplit(f, 0, size))
            else:
                step = self.split_size
                splits.extend(SegmentSplit(f, a, min(size, a + step)) for a in range(0, size, step))
        # Spark needs at least one partition; an empty store reads as no rows.
        return splits or [SegmentSplit("", 0, 0)]

    def read(self, partition: SegmentSplit) -> Iterator[pa.RecordBatch]:
        if not partition.path:
            return
        if self.view == "segments":
            yield facts_batch([scan_segment(Path(partition.path))])
            return
        batches = read_segment(
            Path(partition.path), partition.start, partition.stop, batch_records=self.batch_records,
            on_error=self.on_error,
        )  # fmt: skip
        if self.broker_name is None:
            yield from batches
        else:
            yield from (columnar.table_rows(b, self.broker_name) for b in batches)
