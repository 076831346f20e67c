"""The local replay engine's ordering and planning over Arrow rows (its runs against a broker, the lake and live
stores are tests/test_replay.py's and tests/test_replay_stores.py's, parametrized over both engines)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipelines.replay import local
from pipelines.replay.progress import QueueProgress


def _rows(*rows: tuple[str, str, int, int, str]) -> pa.Table:
    b, t, q, o, src = zip(*rows, strict=True)
    return pa.table({"broker_name": list(b), "topic": list(t), "queue_id": pa.array(q, pa.int32()),
                     "queue_offset": pa.array(o, pa.int64()), "source": list(src)})  # fmt: skip


@pytest.mark.unit
def test_rows_in_commitlog_order_are_taken_as_they_are():
    rows = _rows(("a", "T", 0, 0, "live"), ("a", "T", 1, 0, "live"), ("b", "T", 0, 0, "live"),
                 ("a", "T", 0, 1, "live"), ("a", "U", 0, 5, "live"), ("a", "T", 1, 1, "live"))  # fmt: skip
    assert local.in_order(rows) is rows  # no copy of the bodies


@pytest.mark.unit
def test_out_of_order_and_repeated_rows_are_sorted_and_each_key_kept_once_the_first_copy():
    # a tier file listed after a later one, and a segment both tiered (lake) and live
    rows = _rows(("a", "T", 0, 2, "lake"), ("a", "T", 0, 3, "lake"), ("a", "T", 0, 0, "lake"),
                 ("a", "T", 0, 1, "lake"), ("b", "T", 0, 0, "lake"), ("a", "T", 0, 3, "live"),
                 ("a", "T", 0, 4, "live"), ("b", "T", 0, 0, "live"), ("a", "T", 1, 0, "live"))  # fmt: skip
    got = local.in_order(rows).to_pylist()
    keys = [(r["broker_name"], r["topic"], r["queue_id"], r["queue_offset"]) for r in got]
    assert len(keys) == len(set(keys)) == 7
    for queue in {k[:3] for k in keys}:
        offsets = [k[3] for k in keys if k[:3] == queue]
        assert offsets == sorted(offsets)
    assert {(r["broker_name"], r["queue_offset"]): r["source"] for r in got if r["queue_id"] == 0}[("a", 3)] == "lake"
    assert [r["queue_offset"] for r in got][:3] == [0, 0, 0]  # queues interleave: the sender keeps all of them busy


@pytest.mark.unit
def test_plan_and_rows_to_send_skip_what_progress_recorded():
    rows = local.in_order(_rows(*[("a", "T", q, o, "live") for o in range(5) for q in range(3)]))
    recorded = {("a", "T", 0): QueueProgress(2), ("a", "T", 2): QueueProgress(4), ("x", "T", 0): QueueProgress(9)}
    plans = local.plan(rows, recorded)
    assert [(p.key, p.rows, p.min_offset, p.max_offset, p.already_done, p.resume_after) for p in plans] == [
        (("a", "T", 0), 5, 0, 4, 3, 2), (("a", "T", 1), 5, 0, 4, 0, -1), (("a", "T", 2), 5, 0, 4, 5, 4)]
    todo = [p for p in plans if p.rows > p.already_done]
    sent = [(r["queue_id"], r["queue_offset"]) for b in local.to_send(rows, recorded, todo) for r in b.to_pylist()]
    assert sent == [(1, 0), (1, 1), (1, 2), (0, 3), (1, 3), (0, 4), (1, 4)]
