"""Spark reads of a Delta snapshot on object storage without Hadoop's S3A jars (Maven cannot be reached here).

``lake.read_table`` lists the snapshot's files and their partition values from the Delta log (delta-rs, on the
driver) and hands them to this Python data source (``mqlake_delta_files``): each Spark task opens its files
through pyarrow's ``S3FileSystem`` and yields their row batches with the partition columns filled in from
the log.  Exactly the snapshot's files are read (never a listing, which would also find removed files), as
the local path does.

The executors reach the bucket with the settings the driver passes as options (endpoint, region, keys: Spark
redacts option names holding ``secret``/``token`` in plans and the UI), so a cluster's workers need no AWS
environment of their own.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from broker.lake.objectstore import S3Settings, configure, key_of, settings_env

NAME = "mqlake_delta_files"
FILES_PER_TASK = 4  # tier files are tens of MB; a few per task keeps task overhead small and spreads the reads


def read(spark, files: Sequence[tuple[str, dict[str, str | None]]], arrow_schema: pa.Schema, spark_schema):
    """A DataFrame of ``files`` (URI, partition values) in ``arrow_schema`` (the table's, from its Delta log)."""
    reader = (
        spark.read.format(NAME)
        .schema(spark_schema)
        .option("files", json.dumps([list(f) for f in files]))
        .option("arrow_schema", base64.b64encode(arrow_schema.serialize().to_pybytes()).decode("ascii"))
    )
    for key, value in settings_env().items():  # lower-case option names: Spark's own are case-insensitive
        reader = reader.option(key.lower(), value)
    return reader.load()


@dataclass
class FileGroup(InputPartition):
    files: list[tuple[str, dict[str, str | None]]]


class DeltaFilesDataSource(DataSource):
    """Reads given parquet files of a Delta snapshot on S3 (options ``files``, ``arrow_schema``, ``aws_*``)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        raise ValueError(f"the {NAME} source needs the table's schema (DataFrameReader.schema)")

    def reader(self, schema) -> DataSourceReader:
        return DeltaFilesReader(dict(self.options))


class DeltaFilesReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.files = [(uri, values) for uri, values in json.loads(options["files"])]
        self.arrow_schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(options["arrow_schema"])))
        self.env = {key.upper(): value for key, value in options.items() if key.lower().startswith("aws_")}

    def partitions(self) -> Sequence[InputPartition]:
        return [FileGroup(self.files[i : i + FILES_PER_TASK]) for i in range(0, len(self.files), FILES_PER_TASK)]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        configure(self.env)
        fs = S3Settings.from_env().filesystem()
        schema = self.arrow_schema
        for uri, values in partition.files:
            data = [f.name for f in schema if f.name not in values]
            parquet = pq.ParquetFile(key_of(uri), filesystem=fs)
            for batch in parquet.iter_batches(columns=data):
                n = batch.num_rows
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array([values[f.name]] * n, pa.string()).cast(f.type)
                        if f.name in values
                        else batch.column(f.name).cast(f.type)
                        for f in schema
                    ],
                    schema=schema,
                )
