"""Run-time broker settings (UPDATE_BROKER_CONFIG's rules) and the NameServer's kvConfig.json, without a server."""

from __future__ import annotations

import pytest

from broker.config import build_configs
from broker.namesrv.kv_config import KVConfigManager
from broker.remoting.codes import ResponseCode
from broker.server import runtime_config as rc
from store.config_files import ConfigFileError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("body", "code", "remark"),
    [
        ("noSuchKey=1", ResponseCode.INVALID_PARAMETER, "unknown broker config key noSuchKey"),
        ("listenPort=1", ResponseCode.INVALID_PARAMETER, "broker config key listenPort cannot change at run time"),
        ("brokerPermission=99", ResponseCode.INVALID_PARAMETER, "brokerPermission='99'"),
        ("configBlackList=x", ResponseCode.NO_PERMISSION, "Can not update config in black list."),
    ],
)
def test_refused_updates_name_the_key_and_change_nothing(body: str, code: int, remark: str) -> None:
    broker, store = build_configs({})
    before = rc.all_configs(broker, store)
    with pytest.raises(rc.ConfigUpdateRefused) as e:
        # a good key first: all or nothing
        rc.update_configs("fileReservedTime=1\n" + body, broker, store)
    assert e.value.code == code and remark in e.value.remark
    assert rc.all_configs(broker, store) == before


def test_accepted_update_changes_the_live_configs_and_reports_the_keys() -> None:
    broker, store = build_configs({})
    seen: list[set[str]] = []
    changed = rc.update_configs("brokerPermission=4\ndeleteWhen=01;13\n", broker, store, seen.append)
    assert changed == {"brokerPermission": "4", "deleteWhen": "01;13"}
    assert broker.broker_permission == 4 and store.delete_when == "01;13"
    assert seen == [{"brokerPermission", "deleteWhen"}]
    text = rc.format_configs(rc.all_configs(broker, store)).decode()
    assert "brokerPermission=4\n" in text and "deleteWhen=01;13\n" in text


def test_kv_config_round_trips_through_its_file(tmp_path) -> None:
    path = tmp_path / "namesrv" / "kvConfig.json"
    kv = KVConfigManager(path)
    kv.put("ORDER_TOPIC_CONFIG", "T", "broker-a:4")
    kv.put("NS", "k", "v")
    kv.delete("NS", "k")
    again = KVConfigManager(path)
    again.load()
    assert again.table == {"ORDER_TOPIC_CONFIG": {"T": "broker-a:4"}}


def test_unusable_kv_config_is_an_error_naming_the_file(tmp_path) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_text('{"configTable": {"NS": "not an object"}}')
    with pytest.raises(ConfigFileError) as e:
        KVConfigManager(path).load()
    assert str(path) in str(e.value)


def test_log_files_split_the_servers_and_rotate(tmp_path) -> None:
    import logging

    from cli.log_files import BACKUP_COUNT, MAX_BYTES, add_log_files

    handlers = add_log_files(tmp_path / "logs", broker=True, namesrv=True)
    try:
        logging.getLogger("broker.namesrv.route_table").warning("a namesrv record")
        logging.getLogger("broker.server.controller").warning("a broker record")
        for h in handlers:
            h.flush()
        assert [(h.maxBytes, h.backupCount) for h in handlers] == [(MAX_BYTES, BACKUP_COUNT)] * 2
    finally:
        for h in handlers:
            logging.getLogger().removeHandler(h)
            h.close()
    broker_log = (tmp_path / "logs" / "broker.log").read_text()
    namesrv_log = (tmp_path / "logs" / "namesrv.log").read_text()
    assert "a broker record" in broker_log and "a namesrv record" not in broker_log
    assert "a namesrv record" in namesrv_log and "a broker record" not in namesrv_log


def test_broker_config_shows_no_tls_secret_and_takes_no_tls_key() -> None:
    broker, store = build_configs({"tls.server.keyPassword": "s3cret"})
    text = rc.format_configs(rc.all_configs(broker, store)).decode()
    assert "s3cret" not in text and not any(line.startswith("tls") for line in text.splitlines())
    with pytest.raises(rc.ConfigUpdateRefused) as e:
        rc.update_configs("tls=x", broker, store)
    assert "unknown broker config key tls" in e.value.remark
