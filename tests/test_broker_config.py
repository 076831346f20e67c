"""broker.conf: Java properties syntax, RocketMQ key names, warnings for unknown keys (with the key they resemble),
a misspelled durability or security key stopping start-up, command-line overrides, errors naming the key."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from broker.config import (
    DEFAULT_STORE_DIR,
    BrokerConfig,
    BrokerConfigError,
    load_broker_conf,
    load_namesrv_conf,
    parse_properties,
)
from broker.remoting.codes import ResponseCode
from broker.server.runtime_config import ConfigUpdateRefused, update_configs
from store.config import BrokerRole, FlushDiskType, MessageStoreConfig, keys_where
from store.retention import is_deletion_hour

pytestmark = pytest.mark.unit


def test_java_properties_syntax() -> None:
    text = (
        "# comment\n"
        "! also a comment\n"
        "   \n"
        "a=1\n"
        "b : two\n"
        "c three\n"
        "d = spaced value  \n"
        "long = first,\\\n"
        "       second\n"
        "esc\\=key=tab\\there\\u0041\n"
        "empty=\n"
        "a=overridden\n"
    )
    assert parse_properties(text) == {
        "a": "overridden",
        "b": "two",
        "c": "three",
        "d": "spaced value  ",
        "long": "first,second",
        "esc=key": "tab\thereA",
        "empty": "",
    }


def test_malformed_unicode_escape_names_the_line() -> None:
    with pytest.raises(BrokerConfigError, match=r"x.conf:2: malformed"):
        parse_properties("a=1\nb=\\u12\n", "x.conf")


def test_rocketmq_keys_split_between_broker_and_store(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "brokerClusterName = C1\n"
        "brokerName = broker-x\n"
        "brokerId = 0\n"
        "brokerIP1 = 127.0.0.2\n"
        "listenPort = 20911\n"
        "namesrvAddr = 127.0.0.1:9876;127.0.0.1:9877\n"
        f"storePathRootDir = {tmp_path / 'store'}\n"
        "mapedFileSizeCommitLog = 1048576\n"
        "mappedFileSizeConsumeQueue = 6000\n"
        "maxHashSlotNum = 100\n"
        "maxIndexNum = 400\n"
        "flushDiskType = SYNC_FLUSH\n"
        "fileReservedTime = 48\n"
        "deleteWhen = 03;15\n"
        "diskMaxUsedSpaceRatio = 88\n"
        "autoCreateTopicEnable = false\n"
        "defaultTopicQueueNums = 4\n"
        "messageIndexEnable = false\n"
        "maxMessageSize = 65536\n"
        "longPollingEnable = false\n"
        "expiredSegmentPolicy = delete\n"
    )
    broker, store = load_broker_conf(conf)
    assert (broker.broker_cluster_name, broker.broker_name, broker.broker_addr) == ("C1", "broker-x", "127.0.0.2:20911")
    assert broker.namesrv_addrs == ["127.0.0.1:9876", "127.0.0.1:9877"]
    assert broker.auto_create_topic_enable is False and broker.long_polling_enable is False
    assert broker.default_topic_queue_nums == 4
    assert store.store_path_root_dir == tmp_path / "store"
    assert store.mapped_file_size_commit_log == 1048576  # from the 4.x spelling
    assert store.mapped_file_size_consume_queue == 6000
    assert (store.max_hash_slot_num, store.max_index_num) == (100, 400)
    assert store.flush_disk_type == FlushDiskType.SYNC_FLUSH
    assert (store.file_reserved_time, store.delete_when, store.disk_max_used_space_ratio) == (48, "03;15", 88)
    assert store.message_index_enable is False and store.max_message_size == 65536
    assert store.expired_segment_policy.value == "delete"
    assert store.store_host == "127.0.0.2:20911"  # every record carries the broker's address


def test_defaults_without_a_file() -> None:
    broker, store = load_broker_conf(None)
    assert broker.broker_addr == "127.0.0.1:10911" and broker.namesrv_addrs == []
    assert store.store_path_root_dir == DEFAULT_STORE_DIR


def test_unknown_key_is_a_warning_naming_it(tmp_path: Path, caplog) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=b\nfileReservedTime2=48\nlistenPrt=1\n")
    with caplog.at_level(logging.WARNING, logger="broker.config"):
        broker, _ = load_broker_conf(conf)
    assert broker.broker_name == "b"
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "'fileReservedTime2'" in messages and "'listenPrt'" in messages and str(conf) in messages


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("listenPort=abc", "listenPort"),
        ("listenPort=70000", "listenPort"),
        ("flushDiskType=SOMETIMES", "flushDiskType"),
        ("mappedFileSizeCommitLog=-1", "mappedFileSizeCommitLog"),
        ("deleteWhen=25", "deleteWhen"),
        ("autoCreateTopicEnable=maybe", "autoCreateTopicEnable"),
    ],
)
def test_invalid_value_is_an_error_naming_the_key(tmp_path: Path, line: str, key: str) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(line + "\n")
    with pytest.raises(BrokerConfigError) as err:
        load_broker_conf(conf)
    assert key in str(err.value) and str(conf) in str(err.value)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(BrokerConfigError, match="cannot read"):
        load_broker_conf(tmp_path / "nope.conf")


def test_unknown_key_warning_names_the_key_it_resembles(tmp_path: Path, caplog) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("listenPrt=1\nsomethingElse=2\n")
    with caplog.at_level(logging.WARNING, logger="broker.config"):
        load_broker_conf(conf)
    messages = [r.getMessage() for r in caplog.records]
    assert any("'listenPrt'" in m and "did you mean 'listenPort'" in m for m in messages), messages
    assert any("'somethingElse'" in m and "did you mean" not in m for m in messages), messages


@pytest.mark.parametrize(
    ("line", "suggestion"),
    [
        ("flushDiskTyp=SYNC_FLUSH", "flushDiskType"),
        ("flushdisktype=SYNC_FLUSH", "flushDiskType"),
        ("brokerRol=SYNC_MASTER", "brokerRole"),
        ("syncFlushTimeOut=100", "syncFlushTimeout"),
        ("aclEnabled=true", "aclEnable"),
        ("tls.server.mod=enforcing", "tls.server.mode"),
        ("innerClientAuthenticationCredential={}", "innerClientAuthenticationCredentials"),
    ],
)
def test_misspelled_durability_or_security_key_stops_start_up(tmp_path: Path, line: str, suggestion: str) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(line + "\n")
    with pytest.raises(BrokerConfigError) as err:
        load_broker_conf(conf)
    message = str(err.value)
    key = line.split("=")[0]
    assert "\n" not in message and str(conf) in message
    assert f"unknown key {key!r} (did you mean {suggestion!r}?)" in message and "strictConfig=false" in message


def test_strict_config_false_starts_with_the_default_and_a_warning(tmp_path: Path, caplog) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("flushDiskTyp=SYNC_FLUSH\nstrictConfig=false\n")
    with caplog.at_level(logging.WARNING, logger="broker.config"):
        _, store = load_broker_conf(conf)
    assert store.flush_disk_type == FlushDiskType.ASYNC_FLUSH
    assert any("did you mean 'flushDiskType'" in r.getMessage() for r in caplog.records)


def test_namesrv_conf_checks_its_keys_the_same_way(tmp_path: Path) -> None:
    conf = tmp_path / "namesrv.conf"
    conf.write_text("aclEnabel=true\n")
    with pytest.raises(BrokerConfigError, match="did you mean 'aclEnable'"):
        load_namesrv_conf(conf)
    conf.write_text("aclEnabel=true\nstrictConfig=false\n")
    assert load_namesrv_conf(conf).acl_enable is False


def test_rocketmq_spelling_of_check_crc_on_recover(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("checkCRCOnRecover=false\n")
    assert load_broker_conf(conf)[1].check_crc_on_recover is False


def test_overrides_win_over_the_file_and_are_checked(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerIP1=10.0.0.1\nlistenPort=10000\nstorePathRootDir=/from/file\n")
    broker, store = load_broker_conf(conf, {"listenPort": 12345, "brokerIP1": None, "storePathRootDir": tmp_path})
    assert (broker.broker_ip1, broker.listen_port, store.store_path_root_dir) == ("10.0.0.1", 12345, tmp_path)
    assert store.store_host == "10.0.0.1:12345"  # every record carries the address the flags give
    with pytest.raises(BrokerConfigError, match="listenPort"):
        load_broker_conf(conf, {"listenPort": 70000})


def test_delete_when_hours() -> None:
    store = MessageStoreConfig(delete_when="04;16")
    assert store.delete_hours == {4, 16}
    at_four = 1_700_000_000 - (time.localtime(1_700_000_000).tm_hour - 4) * 3600
    assert is_deletion_hour("04;16", at_four) and not is_deletion_hour("05", at_four)


def test_run_time_keys_are_declared_on_the_models() -> None:
    assert keys_where(BrokerConfig, "runtime") >= {"brokerPermission", "autoCreateTopicEnable", "traceOn"}
    assert keys_where(MessageStoreConfig, "runtime") >= {"deleteWhen", "fileReservedTime", "maxMessageSize"}
    broker, store = load_broker_conf(None)
    assert update_configs("deleteWhen=05;17\nbrokerPermission=4\n", broker, store) == {
        "deleteWhen": "05;17", "brokerPermission": "4"
    }
    assert store.delete_hours == {5, 17} and broker.broker_permission == 4
    for body in ("flushDiskType=SYNC_FLUSH", "brokerRole=SLAVE"):  # start-up settings: refused, nothing changed
        with pytest.raises(ConfigUpdateRefused) as err:
            update_configs(body, broker, store)
        assert err.value.code == ResponseCode.INVALID_PARAMETER
    assert store.flush_disk_type == FlushDiskType.ASYNC_FLUSH and store.broker_role == BrokerRole.ASYNC_MASTER
