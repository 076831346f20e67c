"""``lakePath``: the broker setting, ``--lake`` on the servers, and the tier command defaulting to it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import BrokerConfigError, load_broker_conf
from tests.helpers import cli_env


@pytest.mark.unit
def test_lake_path_and_cache_size_are_broker_settings(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(f"lakePath={tmp_path / 'lake'}\nlakeCacheBytes=1048576\n", encoding="latin-1")
    broker, _store = load_broker_conf(conf)
    assert broker.lake_path == tmp_path / "lake" and broker.lake_cache_bytes == 1 << 20
    assert load_broker_conf(None)[0].lake_path is None
    conf.write_text("lakeCacheBytes=-1\n", encoding="latin-1")
    with pytest.raises(BrokerConfigError, match="lakeCacheBytes"):
        load_broker_conf(conf)


@pytest.mark.integration
def test_tier_command_defaults_to_the_lake_path_of_the_broker_conf(tmp_path: Path) -> None:
    store, lake = tmp_path / "store", tmp_path / "lake"
    (store / "commitlog").mkdir(parents=True)
    conf = tmp_path / "broker.conf"
    conf.write_text(f"storePathRootDir={store}\nlakePath={lake}\nbrokerName=broker-b\n", encoding="latin-1")

    def tier_cli(*args: str) -> subprocess.CompletedProcess:
        argv = [str(Path(sys.executable).with_name("mqlake")), "tier", "--store-dir", str(store), "--json", *args]
        return subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=120)

    result = tier_cli("--broker-conf", str(conf))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(report["report_path"]).parent.parent == lake  # LAKE/_reports/tier-RUN.json
    assert report["broker_name"] == "broker-b"  # the conf's brokerName names the rows' broker
    result = tier_cli()
    assert result.returncode == 2 and "give --lake, or a --broker-conf that sets lakePath" in result.stderr
