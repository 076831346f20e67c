"""``mqlake replay``'s live stores: ``--broker-store NAME=PATH`` once per broker beside (or instead of) the one
``--store-dir`` / ``--broker-name``; bad pairings are refused before Spark starts.  The replay of two real brokers'
stores is in tests/test_two_brokers.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipelines.replay.spec import ReplaySpec, ReplaySpecError, parse_broker_stores

pytestmark = pytest.mark.unit


def _store(root: Path) -> Path:
    (root / "commitlog").mkdir(parents=True)
    return root


def _spec(lake: Path, **kwargs) -> ReplaySpec:
    return ReplaySpec(lake=lake, source_topics=("A",), target_topic="B", dry_run=True, **kwargs)


def test_each_live_store_is_read_under_its_broker(tmp_path):
    a, b, c = (_store(tmp_path / n) for n in "abc")
    spec = _spec(tmp_path / "lake", store_dir=a, broker_name="broker-a",
                 broker_stores=parse_broker_stores([f"broker-b={b}", f" broker-c = {c}"]))  # fmt: skip
    assert spec.live_stores() == [("broker-a", a), ("broker-b", b), ("broker-c", c)]
    # the single-store form: the broker's default name
    assert _spec(tmp_path / "lake", store_dir=a).live_stores() == [("broker-a", a)]
    assert spec.to_json()["broker_stores"] == [["broker-b", str(b)], ["broker-c", str(c)]]


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
