"""A lake on S3-compatible object storage (moto's server, tests/s3_server.py) written and read by a real Spark
standalone cluster (two workers): ``mqlake tier``, ``sql`` and ``replay`` run as commands with
``--master spark://127.0.0.1:PORT`` and ``--lake s3://...``, their executors in the workers' JVMs.

The workers are started with the bucket's AWS variables in their environment, as a real cluster's machines have
their credentials (variables, profile or instance role): the executors' S3A finds them through the AWS SDK's
default chain, and the driver hands none over in its Spark options.  ``MQLAKE_STAGING_DIR`` is set for the
driver alone and names a directory the workers see at the same path (one machine here; a shared mount on a
real cluster), where the tier's executors stage the files the driver uploads.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from lake import tables
from pipelines.spark_cluster import StandaloneCluster
from store.retention import SegmentManifest, SegmentState
from tests.fixtures_broker import MqlakeServer, read_topic, stop_servers
from tests.fixtures_spark import WrittenStore, write_store
from tests.s3_server import BUCKET, S3Server, aws_env
from tests.test_spark_cluster import _hiding_prefix, assert_ran_on_workers, mqlake

pytestmark = pytest.mark.spark

MESSAGES = 500  # two sealed 64 KiB segments, more open ones
LAKE = f"s3://{BUCKET}/cluster-lake"
BROKER = "broker-s3"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("cluster_s3")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster_s3_spark")
    hidden = base / "hidden"  # an empty tmpfs for the workers: a directory there is the driver's alone
    hidden.mkdir()
    c = StandaloneCluster(base / "spark", workers=2, worker_prefix=_hiding_prefix(hidden))
    with aws_env(s3.env()):  # the workers, and so their executors, start with the bucket's variables
        c.start()
    try:
        c.hidden = hidden
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def driver_env(s3, tmp_path_factory) -> dict[str, str]:
    return {**s3.env(), "MQLAKE_STAGING_DIR": str(tmp_path_factory.mktemp("staging"))}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> WrittenStore:
    return write_store(tmp_path_factory.mktemp("cluster_s3_store"), MESSAGES)


@pytest.fixture(scope="module")
def tiered(cluster, s3, store, driver_env) -> tuple[list[str], dict[int, dict]]:
    """``mqlake tier`` on the cluster into the bucket: (the sealed segments, their rows by commitlog offset)."""
    sealed = sorted(e.file_name for e in SegmentManifest(store.root).entries() if e.state == SegmentState.SEALED)
    assert len(sealed) >= 2
    res = mqlake(cluster, "tier", "--store-dir", str(store.root), "--lake", LAKE, "--file-reserved-time", "0",
                 "--broker-name", BROKER, "--json", spread=True, env=driver_env)  # fmt: skip
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert sorted(s["segment"] for s in report["segments"] if s["state"] == "tiered") == sealed, report
    assert_ran_on_workers(cluster, "mqlake-tier", spread=True)
    return sealed, {off: r for off, r in store.expected.items() if r["segment"] in sealed}


@pytest.mark.timeout(600)  # a cold driver JVM per command: minutes when the machine is busy
def test_tier_into_the_bucket_then_sql_on_the_cluster(cluster, s3, tiered, driver_env):
    from lake import delta as lk

    _, want = tiered
    with aws_env(s3.env()):
        got = lk.to_arrow(f"{LAKE}/{tables.MESSAGES}").select(
            ["broker_name", "commitlog_offset", "topic", "queue_offset", "body"]).to_pylist()  # fmt: skip
    assert sorted(r["commitlog_offset"] for r in got) == sorted(want)  # each sealed message once
    for r in got:
        w = want[r["commitlog_offset"]]
        assert (r["broker_name"], r["topic"], r["queue_offset"], r["body"]) == (
            BROKER, w["topic"], w["queue_offset"], w["body"])  # fmt: skip
    staged = [p for p in Path(driver_env["MQLAKE_STAGING_DIR"]).rglob("*.parquet")]
    assert staged == []  # the executors' staged copies went to the bucket and were removed

    query = "SELECT commitlog_offset, topic, queue_id, queue_offset, body FROM messages"
    res = mqlake(cluster, "sql", "--lake", LAKE, "--format", "json", query, env=driver_env)
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert sorted(r["commitlog_offset"] for r in rows) == sorted(want)
    for r in rows:
        w = want[r["commitlog_offset"]]
        assert (r["topic"], r["queue_id"], r["queue_offset"], base64.b64decode(r["body"])) == (
            w["topic"], w["queue_id"], w["queue_offset"], w["body"])  # fmt: skip
    assert_ran_on_workers(cluster, "mqlake-sql")


@pytest.mark.timeout(600)
def test_replay_from_the_bucket_on_the_cluster(cluster, tiered, driver_env, tmp_path):
    _, want = tiered
    orders = sorted(r["body"] for r in want.values() if r["topic"] == "Orders")
    assert orders
    server = MqlakeServer(tmp_path / "broker").start()
    try:
        mqlake(cluster, "replay", "--lake", LAKE, "--source-topic", "Orders", "--target-topic", "OrdersFromS3",
               "--namesrv", server.namesrv_addr, env=driver_env)  # fmt: skip
        assert_ran_on_workers(cluster, "mqlake-replay")
        got = read_topic(server.namesrv_addr, "OrdersFromS3", len(orders))
        assert sorted(m.body for msgs in got.values() for m in msgs) == orders
    finally:
        stop_servers([server])


@pytest.mark.timeout(600)
def test_a_staging_dir_the_workers_cannot_see_fails_before_anything_is_staged(cluster, s3, tmp_path):
    root = write_store(tmp_path / "store", MESSAGES).root  # its own: the other tests' store is tiered
    sealed = {e.file_name for e in SegmentManifest(root).entries() if e.state == SegmentState.SEALED}
    assert sealed
    staging = cluster.hidden / "staging"  # the driver sees it; the workers see an empty tmpfs there
    env = {**s3.env(), "MQLAKE_STAGING_DIR": str(staging)}
    res = mqlake(cluster, "tier", "--store-dir", str(root), "--lake", f"s3://{BUCKET}/unseen-lake",
                 "--file-reserved-time", "0", check=False, env=env)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr  # the command's error exit
    err = " ".join(res.stderr.split())  # the error line may be wrapped
    assert "a Spark executor on host" in err and f"no such directory: {staging}" in err, res.stderr
    assert "$MQLAKE_STAGING_DIR" in err
    # the claims went back and nothing reached the bucket: the next run (with a shared directory) tiers them all
    assert {e.file_name for e in SegmentManifest(root).entries() if e.state == SegmentState.SEALED} == sealed
    assert s3.keys(BUCKET, "unseen-lake/") == []
