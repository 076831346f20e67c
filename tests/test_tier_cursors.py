"""The lake reader's cursors: a consumer walking a tiered queue is served from where its last pull ended without
searching the snapshot again.  Over real Delta tables (delta-rs, no Spark) of a real store's records, laid out
as the tier job writes them (by queue and offset, row groups spanning queue boundaries): a walk from cursors
returns, pull for pull, what a reader without any returns; no offset is skipped or repeated across row
groups, at the local store's boundary, or where two files hold the same rows; a new table version starts a
snapshot with no cursors, an unchanged one keeps them."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lake import reader as lake_reader
from lake.reader import LakeReader
from lake.tables import MESSAGES, STORE_DATE, table_uri
from tests.helpers import make_config, make_message

TOPIC = "Walk"
QUEUES = 3
COUNT = 240
FAR = 1 << 62


@pytest.fixture(scope="module")
def store_rows(tmp_path_factory) -> tuple[pa.Table, dict[int, list[bytes]]]:
    """A real store's records as tier rows (sorted by queue and offset, as the tier job writes them), and each
    queue's records as the local store served them before tiering."""
    from pipelines.segment_reader import read_segment
    from store.message_store import GetMessageStatus, MessageStore

    config = make_config(tmp_path_factory.mktemp("cursors"))
    expected: dict[int, list[bytes]] = {}
    with MessageStore(config) as store:
        for i in range(COUNT):
            body = bytes([i % 251]) * (40 + (i * 37) % 300)  # varied sizes: byte limits cut pulls anywhere
            assert store.put_message(make_message(TOPIC, i % QUEUES, body, tags=f"t{i % 4}", keys=[f"k{i}"])).ok
        while store.dispatch_behind_bytes > 0:
            store.reput.do_reput()
        for q in range(QUEUES):
            expected[q] = []
            while (r := store.get_message(TOPIC, q, len(expected[q]), 32)).status is GetMessageStatus.FOUND:
                expected[q].extend(r.messages)
        assert sum(map(len, expected.values())) == COUNT
        commitlog = Path(config.store_path_root_dir) / "commitlog"
    rows = pa.Table.from_batches([b for f in sorted(commitlog.iterdir()) for b in read_segment(f)])
    rows = rows.sort_by([("queue_id", "ascending"), ("queue_offset", "ascending")])
    day = pc.cast(pc.divide(rows["store_timestamp"], 86_400_000), pa.int32()).cast(pa.date32())
    return rows.append_column(STORE_DATE, day), expected


def _write(root: Path, rows: pa.Table, mode: str = "append") -> None:
    from deltalake import WriterProperties, write_deltalake

    write_deltalake(table_uri(root, MESSAGES), rows, partition_by=["topic", STORE_DATE], mode=mode,
                    writer_properties=WriterProperties(max_row_group_size=16))  # fmt: skip


@pytest.fixture(scope="module")
def lake(store_rows, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    _write(root, store_rows[0])
    return root


def _walk(reader: LakeReader, queue_id: int, max_nums: int, max_bytes: int, check=None) -> list[bytes]:
    """Pull a queue from 0 to its end: every pull starts where the last one said, returns consecutive offsets
    from there and says the one after its last as the next."""
    got: list[bytes] = []
    offset = 0
    while (found := reader.pull(TOPIC, queue_id, offset, FAR, max_nums, max_bytes)) is not None:
        assert found.messages and len(found.messages) <= max_nums
        assert found.queue_offsets == list(range(offset, offset + len(found.messages)))
        assert found.next_begin_offset == offset + len(found.messages)
        if check is not None:
            check(queue_id, offset, found)
        got.extend(found.messages)
        offset = found.next_begin_offset
    return got


@pytest.mark.unit
@pytest.mark.parametrize(("max_nums", "max_bytes", "cache_bytes"), [
    (32, 1 << 20, 64 << 20), (7, 1 << 20, 64 << 20), (32, 900, 64 << 20), (5, 1 << 20, 1),
])  # fmt: skip
def test_a_walk_from_cursors_serves_every_offset_once_in_order(lake, store_rows, max_nums, max_bytes, cache_bytes):
    """Row groups of 16 rows, three queues: runs end inside pulls and at row-group and queue boundaries; a
    cache of 1 byte keeps nothing, so every cursor's row group is decoded again."""
    reader = LakeReader(lake, cache_bytes=cache_bytes)
    for q in range(QUEUES):
        assert _walk(reader, q, max_nums, max_bytes) == store_rows[1][q]
    if max_nums < 16:  # runs longer than a pull: the walks were served from cursors, not only the full path
        assert len(reader.snapshot().cursors) > 0


@pytest.mark.unit
def test_pull_for_pull_a_cursor_answers_what_a_reader_without_one_answers(lake):
    reader = LakeReader(lake)
    seen_cursor = []

    def same_as_fresh(queue_id, offset, found):
        seen_cursor.append(reader.snapshot().cursors.find(TOPIC, queue_id, offset) is not None)
        fresh = LakeReader(lake).pull(TOPIC, queue_id, offset, FAR, 9, 2_000)
        assert (fresh.messages, fresh.queue_offsets, fresh.next_begin_offset) == (
            found.messages, found.queue_offsets, found.next_begin_offset)  # fmt: skip

    for q in range(QUEUES):
        _walk(reader, q, 9, 2_000, same_as_fresh)
    assert sum(seen_cursor) > len(seen_cursor) // 2


@pytest.mark.unit
def test_a_cursor_never_crosses_the_local_stores_first_offset(lake, store_rows):
    """``upper`` is where the local store takes over: a pull from a cursor stops there, and the walk goes on
    from it (here, back in the tier with a higher bound) with no gap and no repeat."""
    reader = LakeReader(lake)
    first = reader.pull(TOPIC, 1, 0, FAR, 10, 1 << 20)
    assert first.queue_offsets == list(range(10))
    assert reader.snapshot().cursors.find(TOPIC, 1, 10) is not None
    cut = reader.pull(TOPIC, 1, 10, 13, 32, 1 << 20)
    assert cut.queue_offsets == [10, 11, 12] and cut.next_begin_offset == 13
    assert reader.pull(TOPIC, 1, 13, 13, 32, 1 << 20) is None  # nothing of the tier below the local store
    rest = reader.pull(TOPIC, 1, 13, FAR, 32, 1 << 20)
    assert rest.queue_offsets[0] == 13
    assert first.messages + cut.messages + rest.messages == store_rows[1][1][: 13 + len(rest.messages)]


@pytest.mark.unit
def test_offsets_two_files_of_one_snapshot_both_hold_are_served_once(store_rows, tmp_path):
    """A second file holding offsets 20-49 of queue 1 again, here with other bodies (as after a store was
    reset and its queue offsets began again): each offset still comes once, and a pull from a cursor gives
    what a reader without cursors gives (the cursor's run stops where the other file's rows begin)."""
    rows, expected = store_rows
    root = tmp_path / "lake"
    _write(root, rows)
    again = rows.filter(pc.equal(rows["queue_id"], 1)).slice(20, 30)
    bodies = pa.array([b[::-1] for b in again["body"].to_pylist()], pa.binary())
    _write(root, again.set_column(again.schema.get_field_index("body"), "body", bodies))
    reader = LakeReader(root)
    assert len(reader.snapshot().files) == 2

    def same_as_fresh(queue_id, offset, found):
        fresh = LakeReader(root).pull(TOPIC, queue_id, offset, FAR, 6, 1 << 20)
        assert (fresh.messages, fresh.queue_offsets) == (found.messages, found.queue_offsets), offset

    for q in range(QUEUES):
        got = _walk(reader, q, 6, 1 << 20, same_as_fresh)
        assert len(got) == len(expected[q])
        assert got == expected[q] or q == 1


@pytest.mark.unit
def test_a_new_table_version_starts_with_no_cursors_and_an_unchanged_one_keeps_them(store_rows, tmp_path,
                                                                                    monkeypatch):  # fmt: skip
    from deltalake import DeltaTable

    monkeypatch.setattr(lake_reader, "REFRESH_S", 0.0)  # every read checks the tables' versions
    rows, expected = store_rows
    root = tmp_path / "lake"
    _write(root, rows.slice(0, 100))
    reader = LakeReader(root)
    got, offset = [], 0
    for _ in range(3):
        found = reader.pull(TOPIC, 0, offset, FAR, 6, 1 << 20)
        got.extend(found.messages)
        offset = found.next_begin_offset
    before = reader.snapshot()
    assert reader.snapshot() is before and before.cursors.find(TOPIC, 0, offset) is not None  # same version
    # the rest of the rows, then a compaction that rewrites every file: two new versions
    _write(root, rows.slice(100))
    DeltaTable(table_uri(root, MESSAGES)).optimize.compact()
    after = reader.snapshot()
    assert after is not before and after.version > before.version and len(after.cursors) == 0
    got.extend(_walk_from(reader, 0, offset))
    assert got == expected[0]


def _walk_from(reader: LakeReader, queue_id: int, offset: int) -> list[bytes]:
    got = []
    while (found := reader.pull(TOPIC, queue_id, offset, FAR, 6, 1 << 20)) is not None:
        assert found.queue_offsets == list(range(offset, offset + len(found.messages)))
        got.extend(found.messages)
        offset = found.next_begin_offset
    return got
