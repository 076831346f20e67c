"""The SparkSession factory every pipeline uses, and the ``--master`` / ``--conf`` options their CLIs share.

pyspark is imported only inside :func:`get_spark`, so a CLI that imports this module still starts fast.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from store.errors import MQLakeError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENV_MASTER = "MQLAKE_SPARK_MASTER"
ENV_CONF = "MQLAKE_SPARK_CONF"
DEFAULT_MASTER = "local[*]"

# Shared typer options: every pipeline command (tier, sql, verify-index, replay) takes these two the same way.
MasterOption = Annotated[
    str | None,
    typer.Option("--master", show_default=False,
                 help=f"Spark master URL (default: spark-submit's --master, ${ENV_MASTER}, or {DEFAULT_MASTER})."),
]
ConfOption = Annotated[
    list[str] | None,
    typer.Option("--conf", help=f"Extra Spark conf k=v (repeatable; also ${ENV_CONF}='k=v,k=v').", show_default=False),
]


class SparkConfError(MQLakeError, ValueError):
    """A Spark conf item that is not ``k=v``."""


def parse_conf(items: str | list[str] | None) -> dict[str, str]:
    """``k=v`` items (or one ``k=v,k=v`` string) -> dict; a malformed item raises SparkConfError naming it."""
    if not items:
        return {}
    if isinstance(items, str):
        items = [i for i in items.split(",") if i.strip()]
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SparkConfError(f"Spark conf {item!r} is not k=v")
        out[key.strip()] = value.strip()
    return out


def add_spark_options(master: str | None, conf: list[str] | None) -> dict:
    """The keyword arguments of :func:`get_spark` from the shared CLI options (a bad --conf is a usage error)."""
    try:
        return {"master": master, "conf": parse_conf(conf)}
    except SparkConfError as e:
        raise typer.BadParameter(str(e), param_hint="--conf") from None


def _defaults(master: str) -> dict[str, str]:
    conf = {
        "spark.sql.session.timeZone": "UTC",
        # Delta readers (delta-rs, Trino, Spark+Delta) expect INT64 micros, not Spark's legacy INT96.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.ui.enabled": "false",  # no port to collide on, less start-up
        "spark.ui.showConsoleProgress": "false",  # progress bars would garble `mqlake sql` output
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "8192",
    }
    if master.startswith("local"):
        cores = os.cpu_count() or 2
        conf |= {
            "spark.sql.shuffle.partitions": str(max(2, 2 * cores)),  # 200 tiny tasks cost more than they save
            "spark.default.parallelism": str(max(2, cores)),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": "3g",
        }
    else:
        # A cluster in client deploy mode: this process is the driver; the executors are JVMs on the workers,
        # each starting Python workers with spark.pyspark.python (this interpreter, at the same path there).
        conf |= {
            "spark.driver.memory": "1g",  # the executors hold the data now
            "spark.executor.memory": "1g",  # fits a worker of `make spark-cluster` (1 core, 1 GiB each)
            "spark.executor.cores": "1",
        }
        if _is_loopback_master(master):  # executors on this machine must reach the driver on loopback too
            conf |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    return conf


def _is_loopback_master(master: str) -> bool:
    hosts = master.removeprefix("spark://").split(",")  # spark://h1:p1,h2:p2 lists standby masters
    return all(h.rsplit(":", 1)[0] in ("127.0.0.1", "localhost") for h in hosts)


def register_sources(spark: SparkSession) -> None:
    """Register mqlake's Python data sources (``commitlog``, ``mqlake_delta_files``) in a session; needed once
    per session."""
    from pipelines.remote_snapshot import DeltaFilesDataSource
    from pipelines.segments import CommitLogDataSource

    spark.dataSource.register(CommitLogDataSource)
    spark.dataSource.register(DeltaFilesDataSource)  # Delta snapshots on S3 (lake.read_table)


def _submitted_master() -> str | None:
    """The ``--master`` of ``spark-submit`` when it launched this driver (its JVM is already up), else None."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connect to spark-submit's JVM, so SparkConf sees its settings
    return SparkConf().get("spark.master", None)


def get_spark(master: str | None = None, app_name: str = "mqlake", conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession on ``master`` (else spark-submit's ``--master`` when it launched this driver, else
    ``$MQLAKE_SPARK_MASTER``, else ``local[*]``) with mqlake's defaults, then ``$MQLAKE_SPARK_CONF``, then
    ``conf`` on top; the commitlog source registered.

    In a process that already has a session, that session is returned (static settings such as the
    master and driver memory cannot change then; runtime ones are applied).
    """
    # Workers must run this interpreter (the venv's): the system Python has no pyarrow or mqlake.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    master = master or _submitted_master() or os.environ.get(ENV_MASTER) or DEFAULT_MASTER
    if master.startswith("local") or _is_loopback_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else a warning about the hostname on every start
    settings = _defaults(master) | parse_conf(os.environ.get(ENV_CONF)) | dict(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_sources(spark)
    return spark
