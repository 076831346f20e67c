"""The SparkSession factory every pipeline uses, and the ``--master`` / ``--conf`` options their CLIs share.

Every session has Delta Lake (``delta-spark``: its SQL extension and catalog) and Hadoop's ``s3a`` filesystem
(``hadoop-aws`` and the AWS SDK bundle) on its classpath: the jars ``make peers`` fetches pinned into
``.peers/delta-spark/lib`` (tools/peers/delta-spark/pom.xml).  They are required.  The driver and the executors
get the folder as ``extraClassPath`` rather than ``spark.jars``: the SDK bundle alone is 600 MiB, which
``spark.jars`` would copy into every executor's work directory.  A cluster's workers need the jars at the same
path (as they need this interpreter at the same path).

``s3://`` lake URIs are read by ``S3AFileSystem``: credentials come from the AWS SDK's standard chain in each JVM
(environment variables, profile, instance role), never from Spark options; only the endpoint, region and
path-style access (not secrets) are set, from the lake's settings (lake/objectstore.py).

pyspark is imported only inside :func:`get_spark`, so a CLI that imports this module still starts fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lake import objectstore
from store.errors import MQLakeError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENV_MASTER = "MQLAKE_SPARK_MASTER"
ENV_CONF = "MQLAKE_SPARK_CONF"
DEFAULT_MASTER = "local[*]"
ENV_DELTA_JARS = "MQLAKE_DELTA_JARS"
DELTA_JARS = Path(__file__).resolve().parents[1] / ".peers" / "delta-spark" / "lib"

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


# Where a pipeline that can run without Spark (verify-index, replay) does its work: "local" in the command's own
# process, or "spark" on the session's executors.
ENGINE_LOCAL, ENGINE_SPARK = "local", "spark"
ENGINES = (ENGINE_LOCAL, ENGINE_SPARK)


def choose_engine(spark: SparkSession | None = None, master: str | None = None) -> str:
    """``"spark"`` when a session is given or the master Spark would run on is not ``local`` (``master``,
    spark-submit's, ``$MQLAKE_SPARK_MASTER``): the files may then be where only the executors reach them.
    Otherwise ``"local"``: for one machine, the JVM's start and shipping every row through Arrow cost more than
    the work itself (docs/benchmarks.md)."""
    return ENGINE_SPARK if spark is not None or not resolved_master(master).startswith("local") else ENGINE_LOCAL


class SparkConfError(MQLakeError, ValueError):
    """A Spark conf item that is not ``k=v``."""


class DeltaJarsMissing(MQLakeError, RuntimeError):
    """The Delta Lake / S3A jars are not where a session is told to load them from."""


def delta_jars_dir() -> Path:
    """The folder of the Delta Lake and S3A jars (``$MQLAKE_DELTA_JARS``, else ``.peers/delta-spark/lib``)."""
    folder = Path(os.environ.get(ENV_DELTA_JARS) or DELTA_JARS)
    if not any(folder.glob("delta-spark_*.jar")) or not any(folder.glob("hadoop-aws-*.jar")):
        raise DeltaJarsMissing(
            f"no Delta Lake / S3A jars in {folder}: run `make peers` (or point ${ENV_DELTA_JARS} at a folder "
            f"holding delta-spark, delta-storage, hadoop-aws and the AWS SDK bundle)"
        )
    return folder


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


def classpath_conf() -> dict[str, str]:
    """The Spark settings that put the Delta Lake / S3A jars on the driver's and the executors' classpath (for a
    ``spark-submit`` command line too: the driver's must be given before its JVM starts)."""
    from pipelines.logs import driver_java_options

    jars = f"{delta_jars_dir()}/*"
    # the JVM's own log goes to a file, not the console, unless --verbose (pipelines/logs.py)
    return {"spark.driver.extraClassPath": jars, "spark.executor.extraClassPath": jars} | driver_java_options()


def _defaults(master: str) -> dict[str, str]:
    conf = classpath_conf() | {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        # Delta readers (delta-rs, Trino, Spark+Delta) expect INT64 micros, not Spark's legacy INT96.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.ui.enabled": "false",  # no port to collide on, less start-up
        "spark.ui.showConsoleProgress": "false",  # progress bars would garble `mqlake sql` output
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "8192",
    } | {f"spark.hadoop.{k}": v for k, v in objectstore.S3Settings.from_env().s3a_settings().items()}
    if master.startswith("local"):
        cores = os.cpu_count() or 2
        # Spark's and Delta's task counts are sized for clusters; on one machine nearly all of a small job's time
        # would be task start-up
        tasks = str(max(2, 2 * cores))
        conf |= {
            "spark.sql.shuffle.partitions": tasks,  # 200 tiny tasks cost more than they save
            "spark.default.parallelism": str(max(2, cores)),
            # VACUUM lists a table's files in this many tasks (Spark's default: 10,000), and Delta rebuilds a
            # snapshot's state in 50 (VACUUM of a small table on a busy 2-core machine: 110 s at the defaults,
            # 16 s at these)
            "spark.sql.sources.parallelPartitionDiscovery.parallelism": tasks,
            "spark.databricks.delta.snapshotPartitions": tasks,
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
    """Register mqlake's Python data source (``commitlog``) in a session; needed once per session."""
    from pipelines.segments import CommitLogDataSource

    spark.dataSource.register(CommitLogDataSource)


def _submitted_master() -> str | None:
    """The ``--master`` of ``spark-submit`` when it launched this driver (its JVM is already up), else None."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connect to spark-submit's JVM, so SparkConf sees its settings
    return SparkConf().get("spark.master", None)


def resolved_master(master: str | None = None) -> str:
    """The master :func:`get_spark` starts a session on: ``master``, else spark-submit's ``--master`` when it
    launched this driver, else ``$MQLAKE_SPARK_MASTER``, else ``local[*]``."""
    return master or _submitted_master() or os.environ.get(ENV_MASTER) or DEFAULT_MASTER


def get_spark(master: str | None = None, app_name: str = "mqlake", conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession on ``master`` (else spark-submit's ``--master`` when it launched this driver, else
    ``$MQLAKE_SPARK_MASTER``, else ``local[*]``) with mqlake's defaults, then ``$MQLAKE_SPARK_CONF``, then
    ``conf`` on top; Delta Lake and S3A on the classpath, the commitlog source registered.

    In a process that already has a session, that session is returned (static settings such as the
    master and driver memory cannot change then; runtime ones are applied).
    """
    # Workers must run this interpreter (the venv's): the system Python has no pyarrow or mqlake.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pipelines.logs import quiet_python_loggers

    quiet_python_loggers()
    master = resolved_master(master)
    if master.startswith("local") or _is_loopback_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else a warning about the hostname on every start
    settings = _defaults(master) | parse_conf(os.environ.get(ENV_CONF)) | dict(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _require_delta(spark)
    register_sources(spark)
    return spark


def _require_delta(spark: SparkSession) -> None:
    """Refuse a session whose JVM was started without the Delta jars (``spark-submit`` without
    ``--driver-class-path``): every lake read and write needs them."""
    try:
        spark.sparkContext._jvm.java.lang.Class.forName("org.apache.spark.sql.delta.sources.DeltaDataSource")
    except Exception as e:  # py4j wraps the ClassNotFoundException
        raise DeltaJarsMissing(
            f"this Spark session has no Delta Lake on its classpath; start it with --driver-class-path "
            f"'{delta_jars_dir()}/*' (and the same spark.executor.extraClassPath)"
        ) from e
