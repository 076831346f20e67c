"""The pipelines on a real Spark standalone cluster: a master and two workers from PySpark's distribution
(``pipelines.spark_cluster``), and ``mqlake tier``, ``sql``, ``verify-index`` and ``replay`` run as commands with
``--master spark://127.0.0.1:PORT`` in client deploy mode, their executors in the workers' JVMs.

Two brokers' stores feed the one lake: ``tier`` runs for ``broker-a`` and ``broker-b`` (two copies of one store:
the same segment names, CommitLog and queue offsets, told apart only by the broker name), ``sql`` counts per
broker, and ``replay`` sends both brokers' history.

The workers run in a mount namespace of their own in which ``hidden/`` is an empty tmpfs: a store under it is
one the driver sees and the executors do not, as on a worker that lacks the store's mount.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lake import tables
from pipelines.spark_cluster import StandaloneCluster
from store.retention import SegmentManifest, SegmentState
from tests.fixtures_broker import MqlakeServer, read_topic, stop_servers
from tests.fixtures_spark import WrittenStore, write_store
from tests.helpers import cli_env

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent
MESSAGES = 500  # two sealed 64 KiB segments (a task each), more open ones


# What unshare(1) and mount(8) say when the kernel (or the container around it) forbids the namespace or the mount.
KERNEL_REFUSALS = ("Operation not permitted", "Permission denied", "Invalid argument", "not supported")


def _hiding_prefix(hidden: Path) -> list[str]:
    """Run a worker in a private mount namespace where ``hidden`` is an empty tmpfs.

    Tried once first: where the kernel refuses the namespace (a container without user namespaces, say) the
    calling test is skipped with unshare's own words; any other failure (no unshare installed) fails it."""
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    prefix = ["unshare", *user, "--mount", "--propagation", "private", "--",
              "sh", "-c", 'mount -t tmpfs tmpfs "$0" && exec "$@"', str(hidden)]  # fmt: skip
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.fail("unshare(1) (util-linux) is not installed: the workers cannot be given a private mount")
    if probe.returncode != 0:
        said = probe.stderr.strip()
        if any(words in said for words in KERNEL_REFUSALS):
            pytest.skip(f"the kernel refuses a private mount namespace for the workers here: {said}")
        pytest.fail(f"unshare failed (exit code {probe.returncode}): {said}")
    return prefix


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    hidden = base / "hidden"
    hidden.mkdir()
    with StandaloneCluster(base / "spark", workers=2, worker_prefix=_hiding_prefix(hidden)) as c:
        c.hidden = hidden
        yield c


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> WrittenStore:
    return write_store(tmp_path_factory.mktemp("cluster_store"), MESSAGES)


def mqlake(
    cluster: StandaloneCluster, *args: str, check: bool = True, spread: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``mqlake ARGS --master spark://...`` as a process of its own: the driver, in client deploy mode, with
    ``env`` added to its environment.  One executor (a JVM on one worker) unless ``spread``: then one on each."""
    cmd = [sys.executable, "-m", "cli", *args, "--master", cluster.master_url,
           "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1",
           "--conf", f"spark.cores.max={cluster.workers if spread else 1}"]  # fmt: skip
    driver_env = cli_env(JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1", **(env or {}))  # its JVM starts faster
    res = subprocess.run(cmd, cwd=REPO, env=driver_env, capture_output=True, text=True, timeout=240)
    if check:
        assert res.returncode == 0, f"{args[0]} exited {res.returncode}:\n{res.stdout}\n{res.stderr[-4000:]}"
    return res


def _json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def executors_of(cluster: StandaloneCluster, app_name: str) -> list[tuple[str, dict]]:
    """(worker id, executor) for every executor the workers launched for the newest app named ``app_name``."""
    apps = [a for a in cluster.status()["completedapps"] + cluster.status()["activeapps"] if a["name"] == app_name]
    assert apps, f"the master ran no app named {app_name}"
    app_id = max(apps, key=lambda a: a["starttime"])["id"]
    out = []
    for w in cluster.status()["workers"]:
        state = _json(w["webuiaddress"] + "/json/")
        out += [(w["id"], e) for e in state["executors"] + state["finishedexecutors"] if e["appid"] == app_id]
    return out


def assert_ran_on_workers(cluster: StandaloneCluster, app_name: str, spread: bool = False) -> None:
    """The app's executors were JVMs launched by the workers (on each of them if ``spread``)."""
    execs = executors_of(cluster, app_name)
    workers = {w["id"] for w in cluster.alive_workers()}
    assert execs and {w for w, _ in execs} <= workers, execs
    if spread:
        assert {w for w, _ in execs} == workers, execs


BROKERS = ("broker-a", "broker-b")


@pytest.fixture(scope="module")
def tiered(cluster, store, tmp_path_factory) -> tuple[Path, list[str], dict]:
    """``mqlake tier`` on the cluster over two copies of the store, as broker-a's and broker-b's, into one lake:
    (lake, tiered segments of each, broker -> the tier's JSON report)."""
    work = tmp_path_factory.mktemp("cluster_tier")
    lake = work / "lake"
    reports = {}
    for name in BROKERS:
        root = work / name / "store"
        shutil.copytree(store.root, root)
        sealed = sorted(e.file_name for e in SegmentManifest(root).entries() if e.state == SegmentState.SEALED)
        assert len(sealed) >= 2
        res = mqlake(cluster, "tier", "--store-dir", str(root), "--lake", str(lake), "--file-reserved-time", "0",
                     "--broker-name", name, "--json", spread=True)  # fmt: skip
        reports[name] = json.loads(res.stdout.strip().splitlines()[-1])
    return lake, sealed, reports


@pytest.mark.timeout(600)  # its fixture tiers two stores, each a cold driver JVM: minutes when the machine is busy
def test_tier_then_sql_on_the_cluster(cluster, store, tiered):
    lake, segments, reports = tiered
    for name, report in reports.items():
        assert report["broker_name"] == name
        assert sorted(s["segment"] for s in report["segments"] if s["state"] == "tiered") == segments, report
    assert_ran_on_workers(cluster, "mqlake-tier", spread=True)

    # the Delta table holds exactly the sealed segments' messages, each once per broker
    want = {off: r for off, r in store.expected.items() if r["segment"] in segments}
    got = DeltaTable(tables.table_uri(lake, tables.MESSAGES)).to_pyarrow_table(
        columns=["broker_name", "commitlog_offset", "topic", "queue_offset", "body"]).to_pylist()  # fmt: skip
    for name in BROKERS:
        assert sorted(r["commitlog_offset"] for r in got if r["broker_name"] == name) == sorted(want)
    for r in got:
        w = want[r["commitlog_offset"]]
        assert (r["topic"], r["queue_offset"], r["body"]) == (w["topic"], w["queue_offset"], w["body"])

    res = mqlake(cluster, "sql", "--lake", str(lake), "--format", "json",
                 "SELECT broker_name, topic, count(*) AS n FROM messages GROUP BY broker_name, topic")  # fmt: skip
    counts = {(row["broker_name"], row["topic"]): row["n"] for row in map(json.loads, res.stdout.splitlines())}
    expected: dict[tuple[str, str], int] = {}
    for name in BROKERS:
        for r in want.values():
            expected[(name, r["topic"])] = expected.get((name, r["topic"]), 0) + 1
    assert counts == expected
    assert_ran_on_workers(cluster, "mqlake-sql")


def test_verify_index_on_the_cluster(cluster, store, tmp_path):
    report = tmp_path / "report.json"
    mqlake(cluster, "verify-index", "--store-dir", str(store.root), "--report", str(report))
    rep = json.loads(report.read_text())
    assert rep["summary"]["ok"]
    per_queue: dict[tuple[str, int], int] = {}
    for r in store.expected.values():
        per_queue[(r["topic"], r["queue_id"])] = per_queue.get((r["topic"], r["queue_id"]), 0) + 1
    assert {(q["topic"], q["queue_id"]): q["matched"] for q in rep["consume_queues"]} == per_queue
    assert_ran_on_workers(cluster, "mqlake-verify-index")


def test_replay_on_the_cluster_is_consumable(cluster, tiered, tmp_path):
    lake = tiered[0]
    tiered_rows = DeltaTable(tables.table_uri(lake, tables.MESSAGES)).to_pyarrow_table(
        columns=["body"], filters=[("topic", "=", "Orders")]).to_pylist()  # fmt: skip
    assert tiered_rows
    server = MqlakeServer(tmp_path / "broker").start()
    try:
        mqlake(cluster, "replay", "--lake", str(lake), "--source-topic", "Orders", "--target-topic", "OrdersAgain",
               "--namesrv", server.namesrv_addr)  # fmt: skip
        assert_ran_on_workers(cluster, "mqlake-replay")
        got = read_topic(server.namesrv_addr, "OrdersAgain", len(tiered_rows))
        # both brokers' rows: the same bodies at the same queue offsets, each sent once per broker
        assert sorted(m.body for msgs in got.values() for m in msgs) == sorted(r["body"] for r in tiered_rows)
        assert {m.properties["REPLAY_SOURCE_BROKER"] for msgs in got.values() for m in msgs} == set(BROKERS)
    finally:
        stop_servers([server])


def test_a_store_the_workers_cannot_see_fails_naming_path_and_host(cluster, store):
    root = cluster.hidden / "store"  # the driver sees it; the workers see an empty tmpfs there
    shutil.copytree(store.root, root)
    try:
        res = mqlake(cluster, "verify-index", "--store-dir", str(root), check=False)
        assert res.returncode == 2, res.stdout + res.stderr
        err = " ".join(res.stderr.split())  # the error line may be wrapped
        assert f"cannot read it (No such file or directory): {root / 'commitlog'}" in err, res.stderr
        assert "a Spark executor on host" in err and "see the store at the driver's path" in err
        assert list((root / "commitlog").iterdir())  # the driver saw it all along
    finally:
        shutil.rmtree(root)
