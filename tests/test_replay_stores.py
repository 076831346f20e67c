"""``mqlake replay``'s live stores: ``--broker-store NAME=PATH`` once per broker beside (or instead of) the one
``--store-dir`` / ``--broker-name``; bad pairings are refused before Spark starts; two stores whose queue ids and
offsets coincide, one of them caught at its tier boundary (a segment in the lake and still live), replay each
record once.  The replay of two running brokers' stores is in tests/test_two_brokers.py."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipelines.replay.spec import ReplaySpec, ReplaySpecError, parse_broker_stores


def _store(root: Path) -> Path:
    (root / "commitlog").mkdir(parents=True)
    return root


def _spec(lake: Path, **kwargs) -> ReplaySpec:
    return ReplaySpec(lake=lake, source_topics=("A",), target_topic="B", dry_run=True, **kwargs)


@pytest.mark.unit
def test_each_live_store_is_read_under_its_broker(tmp_path):
    a, b, c = (_store(tmp_path / n) for n in "abc")
    spec = _spec(tmp_path / "lake", store_dir=a, broker_name="broker-a",
                 broker_stores=parse_broker_stores([f"broker-b={b}", f" broker-c = {c}"]))  # fmt: skip
    assert spec.live_stores() == [("broker-a", a), ("broker-b", b), ("broker-c", c)]
    # the single-store form: the broker's default name
    assert _spec(tmp_path / "lake", store_dir=a).live_stores() == [("broker-a", a)]
    assert spec.to_json()["broker_stores"] == [["broker-b", str(b)], ["broker-c", str(c)]]


@pytest.mark.unit
def test_bad_pairings_are_refused(tmp_path):
    a, b = _store(tmp_path / "a"), _store(tmp_path / "b")
    lake = tmp_path / "lake"
    for text in ("broker-a", "=x", "broker-a="):
        with pytest.raises(ReplaySpecError, match="NAME=STORE_DIR|BROKER_NAME=STORE_DIR"):
            parse_broker_stores([text])
    with pytest.raises(ReplaySpecError, match="broker broker-a is given two live stores"):
        _spec(lake, store_dir=a, broker_stores=(("broker-a", b),))
    (tmp_path / "link").symlink_to(a)  # the same store by another path
    with pytest.raises(ReplaySpecError, match=f"store {re.escape(str(a))} is given twice"):
        _spec(lake, broker_stores=(("broker-a", a), ("broker-b", tmp_path / "link")))
    with pytest.raises(ReplaySpecError, match="no commitlog directory"):
        _spec(lake, broker_stores=(("broker-b", tmp_path / "missing"),))
    with pytest.raises(ReplaySpecError, match="--broker-name names the --store-dir's broker"):
        _spec(lake, broker_name="broker-b", broker_stores=(("broker-a", a),))


@pytest.mark.unit
def test_cli_refuses_a_malformed_broker_store_before_spark(tmp_path):
    from cli.main import app

    store, other = _store(tmp_path / "a"), _store(tmp_path / "b")
    base = ["replay", "--lake", str(tmp_path / "lake"), "--source-topic", "A", "--target-topic", "B", "--dry-run"]
    for extra, message in ((["--broker-store", str(store)], "BROKER_NAME=STORE_DIR"),
                           (["--broker-store", f"a={store}", "--broker-store", f"a={other}"], "two live stores"),
                           (["--broker-store", f"a={tmp_path / 'nope'}"], "no commitlog")):  # fmt: skip
        result = CliRunner().invoke(app, base + extra)
        assert result.exit_code == 2, result.output
        assert message in result.output


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["spark", "local"])
def test_two_stores_one_at_its_tier_boundary_replay_each_record_once(spark, tmp_path, mqlake_server, engine):
    from pipelines.compaction.job import tier
    from pipelines.replay.job import replay
    from pipelines.replay.sender import REPLAY_SOURCE_BROKER, REPLAY_SOURCE_OFFSET, REPLAY_SOURCE_QUEUE
    from pipelines.replay.source import live_segments
    from tests.fixtures_broker import read_topic
    from tests.fixtures_spark import write_store

    topics = ("Orders", "Payments")  # queues 0 and 1 of each store
    stores = {b: write_store(tmp_path / b, 300) for b in ("broker-a", "broker-b")}
    # broker-b's store as its replay reads it: the manifest from before the tier run, so the tiered segments are
    # in the lake AND live (a replay starting while the tier commits)
    before_tier = tmp_path / "broker-b-before-tier"
    shutil.copytree(stores["broker-b"].root, before_tier)
    lake = tmp_path / "lake"
    tiered = {}
    for name, written in stores.items():
        report = tier(written.root, lake, spark=spark, file_reserved_time=0, broker_name=name)
        tiered[name] = {s.base_offset for s in report.segments if s.state == "tiered"}
        assert tiered[name]
    assert tiered["broker-b"] <= set(live_segments(before_tier, None, None))  # read from both sources
    assert not tiered["broker-a"] & set(live_segments(stores["broker-a"].root, None, None))
    want = {
        (b, r["queue_id"]): [x["body"] for x in sorted((x for x in w.expected.values() if x["topic"] == r["topic"]),
                                                       key=lambda x: x["queue_offset"])]
        for b, w in stores.items() for r in w.expected.values() if r["topic"] in topics
    }  # fmt: skip
    target = f"TwoStoresReplayed_{engine}"
    spec = ReplaySpec(lake=lake, source_topics=topics, target_topic=target,
                      namesrv=mqlake_server.namesrv_addr, replay_id=f"two-stores-{engine}", batch_size=32,
                      broker_stores=(("broker-a", stores["broker-a"].root), ("broker-b", before_tier)))  # fmt: skip
    result = replay(spec, spark=spark) if engine == "spark" else replay(spec, engine="local")
    total = sum(len(v) for v in want.values())
    assert result.sent == total

    got: dict[tuple[str, int], list] = {}
    for msgs in read_topic(mqlake_server.namesrv_addr, target, total).values():
        for m in msgs:
            got.setdefault((m.properties[REPLAY_SOURCE_BROKER], int(m.properties[REPLAY_SOURCE_QUEUE])), []).append(m)
    assert sum(len(v) for v in got.values()) == total  # nothing twice
    for key, msgs in got.items():  # each source queue whole and in order: no gap at either tier boundary
        assert [int(m.properties[REPLAY_SOURCE_OFFSET]) for m in msgs] == list(range(len(want[key])))
        assert [m.body for m in msgs] == want[key]
    assert set(got) == set(want)
