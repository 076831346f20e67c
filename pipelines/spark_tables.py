"""The lake's Delta tables in a Spark session: the session's S3A settings, reads through Delta Lake's Spark
reader (every reader feature), and the tables registered for Spark SQL.  Commits and driver-side reads are
delta-rs's (:mod:`lake.delta`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lake import objectstore
from lake.delta import LakeError, is_table, lake_tables
from lake.typed_tables import sql_names

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_applied_s3a: dict[str, str] = {}
# The AWS SDK's system properties for the variables the default credentials chain reads from the environment
_SDK_PROPERTIES = {"AWS_ACCESS_KEY_ID": "aws.accessKeyId", "AWS_SECRET_ACCESS_KEY": "aws.secretAccessKey",
                   "AWS_SESSION_TOKEN": "aws.sessionToken"}  # fmt: skip


def use_lake_settings(spark: SparkSession) -> None:
    """Bring the session's S3A settings up to the lake settings in effect now (objectstore.S3Settings).

    The driver's JVM was started with the environment of its time; AWS credentials set in this process later
    are handed to it as the SDK's system properties (the first link of its default chain), never as Spark or
    Hadoop options, so no plan or configuration shows them.  A process that moves to another endpoint also
    drops its cached S3A filesystems and Delta logs, which still point at the old one.
    """
    env = objectstore.settings_env()
    wanted = objectstore.S3Settings.from_env().s3a_settings()
    state = wanted | {prop: env.get(var, "") for var, prop in _SDK_PROPERTIES.items()}
    if state == _applied_s3a:
        return
    jvm = spark.sparkContext._jvm
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in wanted.items():
        hadoop.set(key, value)
    for key in set(_applied_s3a) - set(state):
        hadoop.unset(key)
    for prop in _SDK_PROPERTIES.values():
        if state[prop]:
            jvm.java.lang.System.setProperty(prop, state[prop])
        else:
            jvm.java.lang.System.clearProperty(prop)
    if _applied_s3a:
        jvm.org.apache.hadoop.fs.FileSystem.closeAll()
        jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    _applied_s3a.clear()
    _applied_s3a.update(state)


def read_table(spark: SparkSession, table_uri: str | Path, version: int | None = None) -> DataFrame:
    """The table at ``version`` (default latest), read by Delta Lake's Spark reader (deletion vectors, column
    mapping and every other reader feature included)."""
    uri = str(table_uri)
    if not is_table(uri):
        raise LakeError(f"{uri} is not a Delta table (no _delta_log)")
    use_lake_settings(spark)
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(uri)


def register(spark: SparkSession, lake_root: str | Path) -> list[str]:
    """Each Delta table directly under ``lake_root`` (``messages``, ``segments``, ``quality_results``, ...) and
    each topic's typed table (under the topic's name, lake/typed_tables.py) as a table of the session's catalog
    at its location; returns the names.

    They are Delta tables to Spark SQL: every query sees the latest snapshot, and history, time travel,
    OPTIMIZE, VACUUM, RESTORE, DELETE, UPDATE and MERGE work on them.  A name already registered is pointed at
    this lake (dropping such an external table deletes no file).
    """
    tables = lake_tables(lake_root)
    tables += sql_names(lake_root, {name for name, _ in tables})
    use_lake_settings(spark)
    names = []
    for name, uri in tables:
        spark.sql(f"DROP TABLE IF EXISTS `{name}`")
        spark.sql(f"CREATE TABLE `{name}` USING delta LOCATION '{_sql_text(uri)}'")
        names.append(name)
    return names


def _sql_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")
