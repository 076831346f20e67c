"""``<store>/mqlake.json``: the store's id and its broker's names, recorded by a real broker at start."""

from __future__ import annotations

import json

import pytest

from store import identity
from store.identity import StoreIdentityError
from tests.fixtures_broker import MqlakeServer


@pytest.mark.unit
def test_the_id_is_made_once_and_a_broker_names_the_store(tmp_path) -> None:
    made = identity.ensure(tmp_path)
    assert identity.ensure(tmp_path) == made and made.broker_name is None and len(made.store_id) == 32
    named = identity.record_broker(tmp_path, "C1", "broker-x")
    assert named == identity.StoreIdentity(made.store_id, "C1", "broker-x") == identity.read(tmp_path)
    assert json.loads((tmp_path / "mqlake.json").read_text()) == {
        "storeId": made.store_id, "brokerClusterName": "C1", "brokerName": "broker-x"}  # fmt: skip
    with pytest.raises(StoreIdentityError, match="belongs to brokerName=broker-x, not brokerName=broker-y"):
        identity.record_broker(tmp_path, "C1", "broker-y")
    with pytest.raises(StoreIdentityError, match="belongs to brokerClusterName=C1, not brokerClusterName=C2"):
        identity.record_broker(tmp_path, "C2", "broker-x")
    assert identity.read(tmp_path) == named  # a refusal writes nothing


@pytest.mark.unit
def test_an_older_store_id_file_is_kept_and_a_bad_file_is_named(tmp_path) -> None:
    (tmp_path / "mqlake-store-id").write_text("abc123\n")
    assert identity.ensure(tmp_path).store_id == "abc123"  # the lake's transaction ids of this store stay
    (tmp_path / "mqlake.json").write_text("{not json")
    with pytest.raises(StoreIdentityError, match=r"mqlake.json: not a readable JSON object"):
        identity.read(tmp_path)
    (tmp_path / "mqlake.json").write_text(json.dumps({"storeId": "abc123", "brokerName": ""}))
    with pytest.raises(StoreIdentityError, match="brokerName must be a non-empty string"):
        identity.read(tmp_path)


@pytest.mark.integration
def test_a_broker_is_refused_a_store_that_names_another_broker(tmp_path) -> None:
    first = MqlakeServer(tmp_path / "a", brokerName="broker-a").start()
    first.stop()
    recorded = identity.read(first.store_dir)
    assert recorded is not None and (recorded.broker_cluster_name, recorded.broker_name) == ("DefaultCluster",
                                                                                                "broker-a")  # fmt: skip
    other = MqlakeServer(tmp_path / "b", brokerName="broker-b", storePathRootDir=str(first.store_dir))
    with pytest.raises(AssertionError) as e:
        other.start()
    assert other.process is not None and other.process.wait(30) == 1
    assert "the store belongs to brokerName=broker-a, not brokerName=broker-b" in str(e.value)
    assert identity.read(first.store_dir) == recorded
    first.start()  # its own broker still starts on it
    first.stop()
