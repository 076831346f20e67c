"""The compiled dispatch loop (store/_dispatch.pyx) against its reference, the per-record Python path.

Both dispatch the same CommitLog into ConsumeQueue and IndexFile files that must be byte-identical; a damaged record
stops either with an error naming the file and the offset; ``MQLAKE_NO_EXTENSIONS=1`` keeps the reference.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from store import dispatch_loop
from store.format import native, records
from store.message_store import MessageStore, PutMessageStatus
from tests import differential
from tests.helpers import make_config, make_message, wait_dispatched

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def compiled_loop() -> None:
    """Fails, rather than skips, when the extension is not built, unless MQLAKE_NO_EXTENSIONS asks for the reference
    alone (as tests/twins.py does for the codec twins)."""
    if not dispatch_loop.built():
        if native.disabled():
            pytest.skip(f"{native.ENV_DISABLE} is set and the compiled loop is not built")
        pytest.fail(f"store._dispatch is not built ({native.missing_cause}); run `make install`")


def _messages() -> list[records.MessageRecord]:
    """Every shape dispatch treats apart: many queues, tags, several keys, non-ASCII topics, keys and tags (the
    reference's), delay levels, transaction states, V2 topics, enough to roll ConsumeQueue files and IndexFiles."""
    out = []
    for i in range(700):
        topic = ("Orders", "Audit", "T\u00f6pic", "V" * 140)[i % 4 if i % 9 else 0]
        keys = [f"order-{i}", f"cust-{i % 17}"] if i % 3 else f"\u00e9t\u00e9-{i}" if i % 7 == 0 else None
        sys_flag = (0, 0, 0, records.TRANSACTION_PREPARED_TYPE, records.TRANSACTION_COMMIT_TYPE,
                    records.TRANSACTION_ROLLBACK_TYPE)[i % 6]  # fmt: skip
        # parked under SCHEDULE_TOPIC_XXXX (a delay level's tags code) for 2 h: no delivery appends during the test
        extra = {"DELAY": "18"} if i % 50 == 0 else {}
        msg = make_message(topic, i % 2, b"m" * (200 + i % 300), tags=("TagA", "\u6807\u7b7e", None)[i % 3],
                           keys=keys, uniq_key=i % 11 != 0, sys_flag=sys_flag, **extra)  # fmt: skip
        out.append(msg)
    return out


def _files(root: Path) -> tuple[dict[str, bytes], list[bytes]]:
    """Every ConsumeQueue file by path, and every IndexFile's bytes in name order (named by the wall clock)."""
    cq = {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "consumequeue").rglob("*")) if p.is_file()}
    index = [p.read_bytes() for p in sorted((root / "index").iterdir())]
    return cq, index


def _redispatch(source: Path, dest: Path, compiled: bool) -> int:
    """A copy of ``source``'s store whose ConsumeQueues and IndexFiles are rebuilt from its CommitLog at start-up;
    returns the records the compiled loop took."""
    shutil.copytree(source, dest)
    shutil.rmtree(dest / "consumequeue")
    shutil.rmtree(dest / "index")
    store = MessageStore(make_config(dest.parent, storePathRootDir=dest))
    store.reput.use_compiled = compiled
    store.start()
    taken = store.reput._compiled.dispatched if store.reput._compiled is not None else 0
    store.shutdown()
    return taken


@pytest.mark.unit
@pytest.mark.parametrize("hold_gil", ["1", "0"], ids=["short-runs-hold-the-gil", "every-run-releases-it"])
def test_both_twins_write_the_same_consume_queue_and_index_files(tmp_path, compiled_loop, monkeypatch, hold_gil):
    monkeypatch.setenv(dispatch_loop.ENV_HOLD_GIL, hold_gil)
    cfg = make_config(tmp_path / "live")
    msgs = _messages()
    store = MessageStore(cfg)
    store.reput.use_compiled = True  # the live store dispatches with the compiled loop, run by run
    with store:
        for msg in msgs:
            assert store.put_message(msg).status == PutMessageStatus.PUT_OK
        wait_dispatched(store)
        live_taken = store.reput._compiled.dispatched
        held = store.reput._compiled.dispatched_holding_gil
    # puts one at a time make short runs: they keep the GIL unless switched off
    assert (held > 0) if hold_gil == "1" else (held == 0)
    root = cfg.store_path_root_dir
    assert len(list(cfg.commitlog_dir.iterdir())) > 3  # several CommitLog segments

    assert _redispatch(root, tmp_path / "python" / "store", compiled=False) == 0
    taken = _redispatch(root, tmp_path / "compiled" / "store", compiled=True)
    live, python = _files(root), _files(tmp_path / "python" / "store")
    compiled = _files(tmp_path / "compiled" / "store")

    assert any(not p.endswith("0" * 20) for p in python[0])  # queues past their first file
    assert any("SCHEDULE_TOPIC_XXXX" in p for p in python[0]) and len(python[1]) > 3  # several IndexFiles
    assert compiled == python
    assert live == python
    # Not vacuous: most records went through the compiled loop, live and at start-up (non-ASCII topics and keys,
    # delay levels, each queue's first record and each rolled file went to the reference).
    assert taken > len(msgs) // 3 and live_taken > len(msgs) // 3


@pytest.mark.unit
@pytest.mark.expected_errors("unreadable record at position")
def test_a_damaged_record_stops_the_compiled_loop_with_file_and_offset(tmp_path, caplog, compiled_loop):
    good = differential.dispatch_segment_from(bytes([20, *range(1, 21)]))
    walk = records.RecordWalk(good)
    starts = walk.positions()
    bad_at = starts[12]
    damaged = bytearray(good)
    damaged[bad_at + 4 : bad_at + 8] = b"\x00\x00\x00\x01"  # no magic a record may have
    with caplog.at_level(logging.ERROR, logger="store.dispatch"):
        python = differential._dispatch_once(tmp_path / "python", bytes(damaged), compiled=False)
        compiled = differential._dispatch_once(tmp_path / "compiled", bytes(damaged), compiled=True)
    assert compiled[:-1] == python[:-1] and compiled[-1] <= python[-1]
    assert compiled[1] == len(damaged)  # dispatch gave up on the rest of the segment, as RocketMQ does
    before = [records.check_record(good, p, check_crc=False).request for p in starts[:12]]
    assert len(compiled[2]) == sum(r.consumable for r in before) > 0  # nothing after it became readable
    segment = str(tmp_path / "compiled" / "commitlog" / "00000000000000000000")
    errors = [r.getMessage() for r in caplog.records if segment in r.getMessage()]
    assert errors == [f"{segment}: unreadable record at position {bad_at} during dispatch: bad magic 0x00000001"]


@pytest.mark.integration
def test_the_switch_keeps_the_reference_dispatch(compiled_loop):
    def chosen(env: dict[str, str]) -> str:
        code = "from store import dispatch_loop; print(dispatch_loop.available())"
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                             check=True, timeout=120)  # fmt: skip
        return out.stdout.strip()

    env = {k: v for k, v in os.environ.items() if k not in ("MQLAKE_NO_EXTENSIONS", "MQLAKE_DISPATCH")}
    assert chosen({**env, "MQLAKE_NO_EXTENSIONS": "1"}) == "False"
    assert chosen({**env, "MQLAKE_DISPATCH": "reference"}) == "False"  # dispatch alone, the codec twins kept
    assert chosen(env) == "True"  # without the switch the compiled loop (built: see compiled_loop) is chosen
