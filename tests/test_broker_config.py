"""broker.conf: Java properties syntax, RocketMQ key names, warnings for unknown keys, errors naming the key."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker.config import DEFAULT_STORE_DIR, BrokerConfigError, load_broker_conf, parse_properties
from store.config import FlushDiskType

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
