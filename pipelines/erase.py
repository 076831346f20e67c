"""``mqlake lake erase``: erase messages from the tiered history by topic and key (or msgId), as a data-protection
request asks, and record that it was done.

1. The ``messages`` table's matching rows (KEYS holding the key or UNIQ_KEY equal to it, as a query by key
   matches; or the offset msgId / UNIQ_KEY for ``--msg-id``) are removed by a Delta DELETE.  Where the table
   has deletion vectors enabled, ``REORG TABLE ... APPLY (PURGE)`` rewrites the files the vectors point into,
   so no data file the snapshot uses still holds an erased row.
2. ``VACUUM`` deletes the files that held them once they are older than the retention the operator gives
   (``--retain-hours``; default: the table's ``delta.deletedFileRetentionDuration``).  Until then time travel
   (``VERSION AS OF``) to an older version still shows them; run the command again (or ``VACUUM``) after the
   retention to delete them for good.
3. An audit row goes to the Delta table ``erasures`` (who, what, when, how many rows, the table version).

Messages still in the live CommitLog (``--store-dir``) are named in the output: the CommitLog is append-only, so
they leave only when their segment expires; once the tier job has tiered that segment, run the erase again.
"""

from __future__ import annotations

import getpass
import json
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lake import objectstore
from lake.tables import MESSAGES, table_uri
from pipelines.objectstore_cli import lake_option
from pipelines.spark import ConfOption, MasterOption, add_spark_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ERASURES = "erasures"  # the audit table under the lake root


@dataclass
class EraseReport:
    erased_at: str
    operator: str
    topic: str
    key: str | None
    msg_id: str | None
    rows: int
    table_version: int | None
    vacuum_retain_hours: float | None
    live: list[dict] = field(default_factory=list)  # still in the CommitLog: commitlog_offset, msg_id, segment


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def match_condition(topic: str, key: str | None, msg_id: str | None) -> str:
    """The SQL condition of the messages to erase: a query by key's match (a KEYS token or UNIQ_KEY), or the
    offset msgId / UNIQ_KEY (the msgId a client sees)."""
    if (key is None) == (msg_id is None):
        raise typer.BadParameter("give exactly one of --key and --msg-id")
    if key is not None:
        which = f"(array_contains(split(coalesce(keys, ''), ' '), {_literal(key)}) OR uniq_key = {_literal(key)})"
    else:
        assert msg_id is not None
        which = f"(msg_id = {_literal(msg_id)} OR uniq_key = {_literal(msg_id)})"
    return f"topic = {_literal(topic)} AND {which}"


def erase(
    spark: SparkSession,
    lake: str | Path,
    topic: str,
    *,
    key: str | None = None,
    msg_id: str | None = None,
    retain_hours: float | None = None,
    store_dir: Path | None = None,
    operator: str | None = None,
) -> EraseReport:
    """Erase the matching messages from the lake's ``messages`` table (DELETE, purge, VACUUM), append the audit
    row, and name the matching messages still in the CommitLog under ``store_dir``."""
    from lake import delta as lk
    from pipelines import spark_tables

    cond = match_condition(topic, key, msg_id)
    uri = table_uri(lake, MESSAGES)
    rows, version = 0, None
    if lk.is_table(uri):
        spark_tables.use_lake_settings(spark)
        rows = spark_tables.read_table(spark, uri).where(cond).count()
        if rows:
            spark.sql(f"DELETE FROM delta.`{uri}` WHERE {cond}")
            props = dict(spark.sql(f"SHOW TBLPROPERTIES delta.`{uri}`").collect())
            if props.get("delta.enableDeletionVectors", "false").lower() == "true":
                spark.sql(f"REORG TABLE delta.`{uri}` APPLY (PURGE)")
        _vacuum(spark, uri, retain_hours)
        version = lk.open_table(uri).version()
    report = EraseReport(
        erased_at=datetime.now(UTC).isoformat(timespec="seconds"), operator=operator or getpass.getuser(),
        topic=topic, key=key, msg_id=msg_id, rows=rows, table_version=version,
        vacuum_retain_hours=None if retain_hours is None else float(retain_hours),
    )  # fmt: skip
    if store_dir is not None:
        live = spark.read.format("commitlog").load(str(store_dir)).where(cond)
        report.live = [r.asDict() for r in live.select("commitlog_offset", "msg_id", "segment").collect()]
    _audit(spark, lake, report)
    return report


def _vacuum(spark: SparkSession, uri: str, retain_hours: float | None) -> None:
    if retain_hours is None:
        spark.sql(f"VACUUM delta.`{uri}`")  # the table's delta.deletedFileRetentionDuration
        return
    # the operator chose the retention: Delta's guard against one below the table's default is for accidents
    key = "spark.databricks.delta.retentionDurationCheck.enabled"
    spark.conf.set(key, "false")
    try:
        spark.sql(f"VACUUM delta.`{uri}` RETAIN {float(retain_hours)} HOURS")
    finally:
        spark.conf.unset(key)


def _audit(spark: SparkSession, lake: str | Path, report: EraseReport) -> None:
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("erased_at", T.TimestampType(), False), T.StructField("operator", T.StringType(), False),
        T.StructField("topic", T.StringType(), False), T.StructField("key", T.StringType()),
        T.StructField("msg_id", T.StringType()), T.StructField("rows", T.LongType(), False),
        T.StructField("table_version", T.LongType()), T.StructField("vacuum_retain_hours", T.DoubleType()),
        T.StructField("live_commitlog_offsets", T.ArrayType(T.LongType()), False),
    ])  # fmt: skip
    row = (datetime.fromisoformat(report.erased_at), report.operator, report.topic, report.key, report.msg_id,
           report.rows, report.table_version, report.vacuum_retain_hours,
           [m["commitlog_offset"] for m in report.live])  # fmt: skip
    spark.createDataFrame([row], schema).write.format("delta").mode("append").save(table_uri(lake, ERASURES))


def erase_command(
    lake: Annotated[str, typer.Option("--lake", help="The lake directory or s3://bucket/prefix.")],
    topic: Annotated[str, typer.Option("--topic", help="The topic of the messages to erase.")],
    key: Annotated[
        str | None, typer.Option("--key", help="Erase the messages with this key (KEYS or UNIQ_KEY).")
    ] = None,
    msg_id: Annotated[str | None, typer.Option("--msg-id", help="Erase the message with this msgId.")] = None,
    retain_hours: Annotated[
        float | None,
        typer.Option("--retain-hours", help="VACUUM retention: files that held erased rows are deleted once older "
                     "(default: the table's delta.deletedFileRetentionDuration)."),
    ] = None,
    store_dir: Annotated[
        Path | None, typer.Option("--store-dir", help="The broker's store: name matching messages still in it.")
    ] = None,
    operator: Annotated[str | None, typer.Option("--operator", help="Who asks (default: the OS user).")] = None,
    master: MasterOption = None,
    conf: ConfOption = None,
) -> None:
    """Erase messages from the tiered history by topic and key or msgId (Delta DELETE + VACUUM, audited)."""
    match_condition(topic, key, msg_id)  # a usage error before any Spark starts
    location = lake_option(lake)
    if not objectstore.is_remote(location) and not Path(location).is_dir():
        raise typer.BadParameter(f"lake directory {lake} does not exist", param_hint="--lake")
    if retain_hours is not None and retain_hours < 0:
        raise typer.BadParameter("must not be negative", param_hint="--retain-hours")
    from pipelines.spark import get_spark

    spark = get_spark(app_name="mqlake-erase", **add_spark_options(master, conf))
    report = erase(spark, location, topic, key=key, msg_id=msg_id, retain_hours=retain_hours, store_dir=store_dir,
                   operator=operator)  # fmt: skip
    print(json.dumps(asdict(report)))
    if report.live:
        sys.stderr.write(
            f"note: {len(report.live)} matching message(s) are still in the live CommitLog of {store_dir} (offsets "
            f"{', '.join(str(m['commitlog_offset']) for m in report.live)}): the CommitLog is append-only, so they "
            f"are served until their segment expires (fileReservedTime); run this erase again once the tier job "
            f"has tiered that segment\n"
        )
