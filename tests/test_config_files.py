"""store.config_files against real files: fastjson dialect, .bak rotation and fallback, round trips."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from store import config_files as cf

pytestmark = pytest.mark.unit

BIG = 2**63 - 1  # Java Long.MAX_VALUE


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_consumer_offsets_with_unquoted_int_keys(tmp_path: Path) -> None:
    # As fastjson pretty-prints it (4.x), with trailing whitespace.
    write_text(
        tmp_path / "consumerOffset.json",
        '{\n\t"offsetTable":{\n\t\t"TopicTest@g1":{0:123,1:456,\n\t\t\t2:-1,3:BIG\n\t\t},'
        '\n\t\t"%RETRY%g1@g1":{0:0}\n\t}\n}\n  \n'.replace("BIG", str(BIG)),
    )
    assert cf.load_consumer_offsets(tmp_path) == {
        "TopicTest@g1": {0: 123, 1: 456, 2: -1, 3: BIG},
        "%RETRY%g1@g1": {0: 0},
    }


def test_consumer_offsets_5x_shape(tmp_path: Path) -> None:
    write_text(
        tmp_path / "consumerOffset.json",
        '{"dataVersion":{"counter":3,"stateVersion":0,"timestamp":1700000000000},'
        '"groupTopicMap":{"g":["t"]},"offsetTable":{"t@g":{0:5}}}',
    )
    assert cf.load_consumer_offsets(tmp_path) == {"t@g": {0: 5}}


def test_delay_offsets_with_unquoted_int_keys(tmp_path: Path) -> None:
    write_text(tmp_path / "delayOffset.json", f'{{"offsetTable":{{1:0,2:37, 18 : {BIG},-3:-9}}}}\t\n')
    assert cf.load_delay_offsets(tmp_path) == {1: 0, 2: 37, 18: BIG, -3: -9}


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"a,1:b":{0:1}}', {"a,1:b": {"0": 1}}),
        ('{"k":"{0:1}","n":{7:8}}', {"k": "{0:1}", "n": {"7": 8}}),
        ('{"k":"x\\",1:2"}', {"k": 'x",1:2'}),
        ('{"k":["{2:3}", 4, 5]}', {"k": ["{2:3}", 4, 5]}),
    ],
)
def test_key_like_text_inside_strings_is_untouched(text: str, expected: object) -> None:
    assert cf.load_lenient_json(text) == expected


def test_topic_name_with_key_like_pattern_round_trips(tmp_path: Path) -> None:
    write_text(tmp_path / "consumerOffset.json", '{"offsetTable":{"a,1:b@{0:1}":{0:9}}}')
    assert cf.load_consumer_offsets(tmp_path) == {"a,1:b@{0:1}": {0: 9}}


def test_parse_error_names_source_and_original_position() -> None:
    with pytest.raises(cf.ConfigFileError) as exc:
        cf.load_lenient_json("{0:1,\n  1:}", source="/x/delayOffset.json")
    msg = str(exc.value)
    assert "/x/delayOffset.json" in msg
    assert "line 2 column 5 (char 10)" in msg  # position in the file as written


def test_write_is_standard_json_with_indent_4(tmp_path: Path) -> None:
    cf.save_consumer_offsets(tmp_path, {"t@g": {1: 2, 0: 1}})
    text = (tmp_path / "consumerOffset.json").read_text(encoding="utf-8")
    assert json.loads(text) == {"offsetTable": {"t@g": {"0": 1, "1": 2}}}
    assert '\n    "offsetTable": {\n        "t@g": {\n            "0": 1,' in text
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_write_moves_previous_content_to_bak(tmp_path: Path) -> None:
    path = tmp_path / "config" / "delayOffset.json"
    cf.save_delay_offsets(path.parent, {1: 10})
    assert not (path.parent / "delayOffset.json.bak").exists()
    first = path.read_bytes()
    cf.save_delay_offsets(path.parent, {1: 11})
    assert (path.parent / "delayOffset.json.bak").read_bytes() == first
    assert cf.load_delay_offsets(path.parent) == {1: 11}


def test_corrupt_main_falls_back_to_bak(tmp_path: Path) -> None:
    cf.save_delay_offsets(tmp_path, {1: 10})
    cf.save_delay_offsets(tmp_path, {1: 11})  # .bak now holds {1: 10}
    write_text(tmp_path / "delayOffset.json", '{"offsetTable":{1:1')
    assert cf.load_delay_offsets(tmp_path) == {1: 10}


def test_empty_or_missing_main_falls_back_to_bak(tmp_path: Path) -> None:
    write_text(tmp_path / "consumerOffset.json.bak", '{"offsetTable":{"t@g":{0:7}}}')
    assert cf.load_consumer_offsets(tmp_path) == {"t@g": {0: 7}}  # main missing
    write_text(tmp_path / "consumerOffset.json", "  \n")
    assert cf.load_consumer_offsets(tmp_path) == {"t@g": {0: 7}}  # main empty


def test_write_over_corrupt_main_keeps_good_bak(tmp_path: Path) -> None:
    write_text(tmp_path / "delayOffset.json.bak", '{"offsetTable":{1:5}}')
    write_text(tmp_path / "delayOffset.json", "\x00\x00\x00")
    cf.save_delay_offsets(tmp_path, {1: 6})
    assert (tmp_path / "delayOffset.json.bak").read_text() == '{"offsetTable":{1:5}}'
    assert cf.load_delay_offsets(tmp_path) == {1: 6}


def test_async_write_takes_the_same_steps_as_the_blocking_one(tmp_path: Path) -> None:
    # the broker's event loop writes through aiofiles: same bytes, same .bak rotation, no temp file left
    path = tmp_path / "config" / "consumerOffset.json"
    asyncio.run(cf.write_config_async(path, cf.consumer_offsets_document({"t@g": {0: 1}})))
    assert not (path.parent / "consumerOffset.json.bak").exists()
    first = path.read_bytes()
    asyncio.run(cf.write_config_async(path, cf.consumer_offsets_document({"t@g": {0: 2}})))
    assert (path.parent / "consumerOffset.json.bak").read_bytes() == first
    cf.save_consumer_offsets(tmp_path / "sync", {"t@g": {0: 2}})
    assert path.read_bytes() == (tmp_path / "sync" / "consumerOffset.json").read_bytes()
    write_text(path, "\x00\x00")  # a corrupt file must not replace the good backup
    asyncio.run(cf.write_config_async(path, cf.consumer_offsets_document({"t@g": {0: 3}})))
    assert (path.parent / "consumerOffset.json.bak").read_bytes() == first
    assert cf.load_consumer_offsets(path.parent) == {"t@g": {0: 3}}
    assert sorted(p.name for p in path.parent.iterdir()) == ["consumerOffset.json", "consumerOffset.json.bak"]


def test_both_corrupt_raises_naming_the_file(tmp_path: Path) -> None:
    path = write_text(tmp_path / "topics.json", '{"topicConfigTable": {')
    write_text(tmp_path / "topics.json.bak", "")
    with pytest.raises(cf.ConfigFileError) as exc:
        cf.load_topics(tmp_path)
    msg = str(exc.value)
    assert exc.value.path == str(path)
    assert str(path) in msg and "line 1 column 23" in msg and "empty" in msg


def test_corrupt_main_without_bak_raises(tmp_path: Path) -> None:
    write_text(tmp_path / "subscriptionGroup.json", "not json")
    with pytest.raises(cf.ConfigFileError, match="subscriptionGroup.json"):
        cf.load_subscription_groups(tmp_path)


def test_missing_files_read_as_empty(tmp_path: Path) -> None:
    assert cf.read_config(tmp_path / "topics.json") is None
    assert cf.load_consumer_offsets(tmp_path) == {}
    assert cf.load_delay_offsets(tmp_path) == {}
    assert cf.load_topics(tmp_path) == {"dataVersion": {"counter": 0, "timestamp": 0}, "topicConfigTable": {}}
    assert cf.load_subscription_groups(tmp_path)["subscriptionGroupTable"] == {}


def test_wrong_shape_raises(tmp_path: Path) -> None:
    write_text(tmp_path / "consumerOffset.json", '{"offsetTable":{"t@g":[1,2]}}')
    with pytest.raises(cf.ConfigFileError, match="consumerOffset.json"):
        cf.load_consumer_offsets(tmp_path)


def test_round_trips(tmp_path: Path) -> None:
    offsets = {"TopicTest@g1": {0: 1, 1: BIG, 2: -1}, "a,1:b@g": {0: 3}}
    cf.save_consumer_offsets(tmp_path, offsets)
    assert cf.load_consumer_offsets(tmp_path) == offsets

    delays = {level: level * 10 for level in range(1, 19)}
    cf.save_delay_offsets(tmp_path, delays)
    assert cf.load_delay_offsets(tmp_path) == delays

    version = cf.next_data_version({"counter": 4, "timestamp": 1})
    assert version["counter"] == 5 and version["timestamp"] > 1
    # 4.x TopicConfig entries, fields in fastjson's alphabetical order
    topic_test = {"order": False, "perm": 6, "readQueueNums": 8, "topicFilterType": "SINGLE_TAG",
                  "topicName": "TopicTest", "topicSysFlag": 0, "writeQueueNums": 8}  # fmt: skip
    ordered = {**topic_test, "order": True, "readQueueNums": 4, "topicName": "Ord", "writeQueueNums": 4}
    topics = {"TopicTest": topic_test, "Ord": ordered}
    cf.save_topics(tmp_path, topics, version)
    assert cf.load_topics(tmp_path) == {"dataVersion": version, "topicConfigTable": topics}
    raw = json.loads((tmp_path / "topics.json").read_text(encoding="utf-8"))
    assert list(raw["topicConfigTable"]["TopicTest"].items()) == list(topic_test.items())

    def group(name: str) -> dict:  # 4.9.8 SubscriptionGroupConfig defaults
        return {"brokerId": 0, "consumeBroadcastEnable": True, "consumeEnable": True, "consumeFromMinEnable": True,
                "groupName": name, "notifyConsumerIdsChangedEnable": True, "retryMaxTimes": 16, "retryQueueNums": 1,
                "whichBrokerWhenConsumeSlowly": 1}  # fmt: skip

    groups = {"g1": group("g1"), "组": group("组")}
    cf.save_subscription_groups(tmp_path, groups, version)
    assert cf.load_subscription_groups(tmp_path) == {"dataVersion": version, "subscriptionGroupTable": groups}
    assert "组" in (tmp_path / "subscriptionGroup.json").read_text(encoding="utf-8")  # UTF-8, not \u escapes


def test_reads_fastjson_topics_5x(tmp_path: Path) -> None:
    write_text(
        tmp_path / "topics.json",
        '{"dataVersion":{"counter":2,"stateVersion":0,"timestamp":1700000000000},"topicConfigTable":'
        '{"T":{"attributes":{},"order":false,"perm":6,"readQueueNums":8,"topicFilterType":"SINGLE_TAG",'
        '"topicName":"T","topicSysFlag":0,"writeQueueNums":8}}}',
    )
    data = cf.load_topics(tmp_path)
    assert data["dataVersion"]["stateVersion"] == 0
    assert data["topicConfigTable"]["T"]["attributes"] == {}
