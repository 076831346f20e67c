"""Where the DAGs take their settings from.

Run-time settings are Airflow Variables, read when a task runs (so changing one needs no DAG reparse):

=========================  ===========================================================  ==================
Variable                   Meaning                                                      Default
=========================  ===========================================================  ==================
``mqlake_store_dir``       the broker's store root (storePathRootDir)                   (required for tier
                                                                                        and verify)
``mqlake_lake``            the lake root (directory or ``s3://bucket/prefix``)          ``lakePath`` of the
                                                                                        broker.conf
``mqlake_broker_conf``     the broker's broker.conf (file sizes, deleteWhen)            ``$MQLAKE_BROKER_CONF``
``mqlake_namesrv``         NameServer HOST:PORT that replays publish through            ``127.0.0.1:9876``
``mqlake_spark_master``    master of the in-process runner (no ``mqlake_spark``         ``local[*]``
                           connection)
``mqlake_spark_conf``      extra Spark conf for both runners, ``k=v,k=v``               (none)
``mqlake_compact_weekday`` the day ``mqlake_tier`` compacts closed partitions           ``sunday``
=========================  ===========================================================  ==================

Schedules are fixed when the DAG file is parsed, and Airflow advises against reading Variables at parse
time, so they come from the environment of the DAG processor: ``MQLAKE_TIER_SCHEDULE`` (cron; default: the
hours of the broker's ``deleteWhen``, read from ``$MQLAKE_BROKER_CONF``, else RocketMQ's ``04``) and
``MQLAKE_VERIFY_SCHEDULE`` (cron; default: daily, twelve hours after the first deletion hour, so a
verification never reads a store the tier job and the broker are deleting from).  Both are in the broker's
local time zone, as ``deleteWhen`` is.

Several brokers.  ``MQLAKE_BROKER_STORES`` (environment of the DAG processor and the workers, read when the
DAG file is parsed, like the schedules: the stores decide the DAGs' tasks) lists the broker stores as JSON::

    [{"broker_name": "broker-a", "store_dir": "/data/a/store", "broker_conf": "/etc/mqlake/a.conf"},
     {"broker_name": "broker-b", "store_dir": "/data/b/store"}]

``mqlake_tier`` and ``mqlake_verify_index`` then have one task group per store (``tier_broker-a``,
``verify_broker-b``, ...), all tiering into the one lake (``mqlake_lake``, else each store's lakePath);
``broker_conf`` is optional per store (else ``mqlake_broker_conf``) and ``broker_name`` goes to
``mqlake tier --broker-name``.  ``mqlake_replay`` reads every store's live CommitLog (``mqlake replay
--broker-store NAME=PATH`` per store) besides the lake.  Without it the DAGs work on the one store of
``mqlake_store_dir``.

Spark runs through the connection ``mqlake_spark`` (type spark) when it exists: ``spark-submit`` launches
the job's module against that connection's master.  Without it the job runs inside the task (PythonOperator)
on ``mqlake_spark_master``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from airflow.sdk.exceptions import AirflowFailException

from store.constants import DEFAULT_NAMESRV_ADDR
from store.errors import MQLakeError

SPARK_CONN_ID = "mqlake_spark"

VAR_STORE_DIR = "mqlake_store_dir"
VAR_LAKE = "mqlake_lake"
VAR_BROKER_CONF = "mqlake_broker_conf"
VAR_NAMESRV = "mqlake_namesrv"
VAR_SPARK_MASTER = "mqlake_spark_master"
VAR_SPARK_CONF = "mqlake_spark_conf"
VAR_COMPACT_WEEKDAY = "mqlake_compact_weekday"

ENV_BROKER_CONF = "MQLAKE_BROKER_CONF"
ENV_TIER_SCHEDULE = "MQLAKE_TIER_SCHEDULE"
ENV_VERIFY_SCHEDULE = "MQLAKE_VERIFY_SCHEDULE"
ENV_BROKER_STORES = "MQLAKE_BROKER_STORES"

DEFAULT_SPARK_MASTER = "local[*]"
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

# Retries and time limits.  The jobs are idempotent (tier: one Delta txn per store and segment order;
# verify-index: rows replaced per run id; replay: progress per replay id), so a retry repeats nothing.
# Limits are generous for this machine's measured rates (tier ~27 MB/s, verify ~50 MB/s per 2 cores): a job
# that runs past them is stuck, not slow.
TIER_TIMEOUT = timedelta(hours=4)
TIER_RETRIES = 2
VERIFY_TIMEOUT = timedelta(hours=2)
VERIFY_RETRIES = 1
DRY_RUN_TIMEOUT = timedelta(hours=1)
REPLAY_TIMEOUT = timedelta(hours=12)  # a rate-limited replay of days of history takes hours by design
REPLAY_RETRIES = 2
RETRY_DELAY = timedelta(minutes=5)
SMALL_TASK_TIMEOUT = timedelta(minutes=10)  # manifest reads, report checks, argument building
COMPACT_TIMEOUT = timedelta(hours=2)

# Every task: one retry unless it says otherwise, and a time limit (job tasks set their own).
DEFAULT_ARGS = {"retries": 1, "retry_delay": RETRY_DELAY, "execution_timeout": SMALL_TASK_TIMEOUT}
START_DATE = datetime(2026, 1, 1, tzinfo=UTC)


def scheduled_dag(cron: str, run_timeout: timedelta) -> dict:
    """The DAG arguments both scheduled DAGs share: the cron in the broker's zone, runs that never overlap
    and no backfill (each run works on the store as it is now)."""
    from airflow.sdk import CronTriggerTimetable

    return {
        "schedule": CronTriggerTimetable(cron, timezone=local_timezone()), "start_date": START_DATE,
        "catchup": False, "max_active_runs": 1, "dagrun_timeout": run_timeout, "default_args": DEFAULT_ARGS,
        "tags": ["mqlake"],
    }  # fmt: skip


class SettingsError(MQLakeError, AirflowFailException):
    """A Variable is missing or malformed; the message names it.  Still an AirflowFailException, so it fails the
    task without retries."""


def delete_hours() -> list[int]:
    """The broker's ``deleteWhen`` hours, from ``$MQLAKE_BROKER_CONF`` (RocketMQ's default 04 without one)."""
    from broker.config import load_broker_conf

    return sorted(load_broker_conf(os.environ.get(ENV_BROKER_CONF) or None)[1].delete_hours)


def tier_schedule() -> str:
    return os.environ.get(ENV_TIER_SCHEDULE) or f"0 {','.join(map(str, delete_hours()))} * * *"


def verify_schedule() -> str:
    return os.environ.get(ENV_VERIFY_SCHEDULE) or f"0 {(delete_hours()[0] + 12) % 24} * * *"


def local_timezone() -> str:
    """The machine's zone name: ``deleteWhen`` hours are the broker's local clock."""
    import pendulum

    return pendulum.local_timezone().name


def run_key(run_id: str) -> str:
    """An Airflow run id as a name our jobs accept ([A-Za-z0-9_-], at most 80 characters)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", run_id)[-80:]


@dataclass(frozen=True)
class BrokerStore:
    """One broker's store in ``MQLAKE_BROKER_STORES``."""

    broker_name: str
    store_dir: str
    broker_conf: str | None = None

    def as_arg(self) -> dict[str, str | None]:
        """What a task takes (plain values: task arguments are serialized)."""
        return {"broker_name": self.broker_name, "store_dir": self.store_dir, "broker_conf": self.broker_conf}


_BROKER_NAME = re.compile(r"[A-Za-z0-9_-]{1,60}")  # it becomes part of task ids and run ids


def broker_stores() -> list[BrokerStore]:
    """The stores of ``MQLAKE_BROKER_STORES`` (empty: not set); a malformed value raises naming it (an import
    error of the DAG file, shown by Airflow)."""
    import json

    raw = os.environ.get(ENV_BROKER_STORES, "").strip()
    if not raw:
        return []
    try:
        items = json.loads(raw)
    except json.JSONDecodeError as e:
        raise SettingsError(f"{ENV_BROKER_STORES} is not JSON: {e}") from None
    if not isinstance(items, list) or not items:
        raise SettingsError(f"{ENV_BROKER_STORES}: expected a non-empty JSON list of stores")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) - {"broker_name", "store_dir", "broker_conf"}:
            raise SettingsError(f"{ENV_BROKER_STORES}[{i}]: expected keys broker_name, store_dir, broker_conf")
        name, store = item.get("broker_name"), item.get("store_dir")
        if not isinstance(name, str) or not _BROKER_NAME.fullmatch(name):
            raise SettingsError(f"{ENV_BROKER_STORES}[{i}]: broker_name {name!r} is not 1-60 of [A-Za-z0-9_-]")
        if not isinstance(store, str) or not store:
            raise SettingsError(f"{ENV_BROKER_STORES}[{i}]: no store_dir")
        out.append(BrokerStore(name, store, item.get("broker_conf") or None))
    names = [s.broker_name for s in out]
    if len(set(names)) != len(names):
        raise SettingsError(f"{ENV_BROKER_STORES}: a broker_name appears twice: {names}")
    return out


def store_arg(store: dict | None) -> BrokerStore | None:
    return BrokerStore(**store) if store else None


@dataclass(frozen=True)
class Settings:
    lake: str
    store_dir: str | None
    broker_conf: str | None
    namesrv: str
    spark_master: str
    spark_conf: list[str] = field(default_factory=list)
    broker_name: str | None = None  # the store's broker (MQLAKE_BROKER_STORES), None: from broker_conf

    def report(self, job: str, key: str) -> str:
        """Where ``job`` writes its JSON report for the task after it: ``LAKE/_reports/JOB-airflow-KEY.json`` (for
        a lake on S3, ``_reports`` of the local staging directory: reports stay on local disk), named as every
        run's report is, so the broker's metrics count the DAGs' runs too."""
        from lake.reports import report_path

        return str(report_path(self.lake, job, f"airflow-{key}"))

    def common_argv(self) -> list[str]:
        """Options every job CLI takes the same way."""
        argv = ["--lake", self.lake]
        for item in self.spark_conf:
            argv += ["--conf", item]
        return argv


def _variable(name: str, default: str | None = None) -> str | None:
    from airflow.sdk import Variable

    value = Variable.get(name, default=None)
    return value.strip() if value and value.strip() else default


def _conf_lake_path(broker_conf: str | None) -> str | None:
    """The broker's ``lakePath``: the DAGs tier into the lake the broker reads from."""
    from broker.config import BrokerConfigError, load_broker_conf

    try:
        path = load_broker_conf(broker_conf)[0].lake_path if broker_conf else None
    except BrokerConfigError as e:
        raise SettingsError(str(e)) from None
    return str(path) if path else None


def settings(*, need_store: bool, store: BrokerStore | None = None) -> Settings:
    """The Variables, checked (raises SettingsError naming the Variable); ``store``: one of
    ``MQLAKE_BROKER_STORES``, in place of ``mqlake_store_dir`` (and of ``mqlake_broker_conf`` if it names one)."""
    broker_conf = _variable(VAR_BROKER_CONF, os.environ.get(ENV_BROKER_CONF))
    if store is not None and store.broker_conf:
        broker_conf = store.broker_conf
    if broker_conf and not os.path.isfile(broker_conf):
        raise SettingsError(f"Variable {VAR_BROKER_CONF}={broker_conf}: no such file")
    lake = _variable(VAR_LAKE) or _conf_lake_path(broker_conf)
    if not lake:
        raise SettingsError(
            f"set the Airflow Variable {VAR_LAKE} to the lake root directory, or lakePath in {VAR_BROKER_CONF}"
        )
    store_dir = store.store_dir if store is not None else _variable(VAR_STORE_DIR)
    if need_store and not store_dir:
        raise SettingsError(f"set the Airflow Variable {VAR_STORE_DIR} to the broker's store root")
    if store_dir and not os.path.isdir(os.path.join(store_dir, "commitlog")):
        where = f"{ENV_BROKER_STORES} ({store.broker_name})" if store is not None else f"Variable {VAR_STORE_DIR}"
        raise SettingsError(f"{where}={store_dir}: no commitlog directory there")
    conf = [c.strip() for c in (_variable(VAR_SPARK_CONF) or "").split(",") if c.strip()]
    bad = [c for c in conf if "=" not in c]
    if bad:
        raise SettingsError(f"Variable {VAR_SPARK_CONF}: {bad[0]!r} is not k=v")
    return Settings(
        lake=lake, store_dir=store_dir, broker_conf=broker_conf,
        namesrv=_variable(VAR_NAMESRV, DEFAULT_NAMESRV_ADDR),
        spark_master=_variable(VAR_SPARK_MASTER, DEFAULT_SPARK_MASTER),
        spark_conf=conf, broker_name=store.broker_name if store is not None else None,
    )  # fmt: skip


def compact_weekday() -> int:
    name = (_variable(VAR_COMPACT_WEEKDAY, "sunday") or "").lower()
    if name not in WEEKDAYS:
        raise SettingsError(f"Variable {VAR_COMPACT_WEEKDAY}={name!r}: use one of {', '.join(WEEKDAYS)}")
    return WEEKDAYS.index(name)
