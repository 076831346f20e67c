"""What the pipelines print on the console, and where the rest goes.

A command prints its own lines and, on failure, one ``error:`` line.  Spark's JVM logs (its banner, warnings,
Java stack traces), pyspark's JSON error records (with the query plan) and Great Expectations' INFO records go to
one log file instead, :func:`spark_log_file` (``$MQLAKE_LOG_DIR/spark.log``, default ``~/logs/mqlake``, as
RocketMQ keeps its logs under ``~/logs/rocketmqlogs``); the error line names that file.  ``--verbose``
(``MQLAKE_VERBOSE=1``, which child processes inherit) leaves all of them on the console as they come.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path

ENV_VERBOSE = "MQLAKE_VERBOSE"
ENV_LOG_DIR = "MQLAKE_LOG_DIR"
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
# Python loggers that talk too much for a console: pyspark's query-error records, Great Expectations' INFO
QUIET_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger", "great_expectations", "py4j")


def verbose() -> bool:
    return os.environ.get(ENV_VERBOSE, "") not in ("", "0", "false")


def set_verbose(on: bool) -> None:
    """``--verbose`` for this process and the jobs it starts."""
    if on:
        os.environ[ENV_VERBOSE] = "1"


def log_dir() -> Path:
    return Path(os.environ.get(ENV_LOG_DIR) or Path.home() / "logs" / "mqlake").expanduser()


def spark_log_file() -> Path:
    return log_dir() / "spark.log"


def driver_java_options() -> dict[str, str]:
    """The Spark setting that sends the driver JVM's log to :func:`spark_log_file` (none with ``--verbose``); it
    must be given before the JVM starts, so spark-submit command lines take it too."""
    if verbose():
        return {}
    spark_log_file().parent.mkdir(parents=True, exist_ok=True)
    return {"spark.driver.extraJavaOptions":
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG} -Dmqlake.spark.log={spark_log_file()}"}  # fmt: skip


class _Py4JLostConnection(logging.Filter):
    """py4j logs a connection the JVM reset under a command (``Exception while sending command.``) at ERROR on the
    root logger, then hands the failure to the command's caller as a ``Py4JError``; when that caller is py4j's own
    finalizer (deleting a Java object Python no longer holds) nothing else happens.  The record goes on as a
    WARNING of ``py4j.java_gateway``: the caller's own exception is the error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.name == "root" and record.pathname.endswith(
                os.path.join("py4j", "java_gateway.py")):  # fmt: skip
            record.levelno, record.levelname, record.name = logging.WARNING, "WARNING", "py4j.java_gateway"
        return True


_PY4J_FILTER = _Py4JLostConnection()


def quiet_python_loggers() -> None:
    """Send the chatty Python loggers to :func:`spark_log_file` instead of the console (not with ``--verbose``)."""
    logging.getLogger().addFilter(_PY4J_FILTER)  # once: a filter already added is not added again
    if verbose():
        return
    path = spark_log_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in QUIET_LOGGERS:
        if name.endswith("ContextLogger"):
            # pyspark logs through its own logger class, which comes with a console handler: make it now, then
            # replace that handler
            from pyspark.logger import PySparkLogger

            logger: logging.Logger = PySparkLogger.getLogger(name)
        else:
            logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
        if name == "great_expectations":
            logger.setLevel(logging.WARNING)


def log_error(e: BaseException) -> Path:
    """Write ``e`` in full (a Java stack trace, a Spark plan) to :func:`spark_log_file`; returns the file."""
    path = spark_log_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(f"{datetime.now():%Y-%m-%d %H:%M:%S} ERROR {type(e).__name__}: {e}\n")
    return path


def error_line(e: BaseException) -> str:
    """The first line of ``e``'s message (a Java exception pyspark does not convert: its class and message), and
    where the rest is (the full text, plan and stack trace, is written there first)."""
    from py4j.protocol import Py4JJavaError

    text = str(e.java_exception.toString()) if isinstance(e, Py4JJavaError) else str(e)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
    return f"{first} (details in {log_error(e)}; --verbose shows Spark's log on the console)"
