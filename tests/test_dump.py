"""``mqlake store dump``, run as a user runs it, over a store written by the real MessageStore."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from store.message_store import MessageStore
from tests.helpers import cli_env, make_config, make_message, wait_dispatched

pytestmark = pytest.mark.integration

MQLAKE = Path(sys.executable).with_name("mqlake")
N = 300


def _dump(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(MQLAKE), "store", "dump", *args], env=cli_env(), capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    cfg = make_config(tmp_path)
    with MessageStore(cfg) as store:
        for i in range(N):
            r = store.put_message(make_message("DumpTopic", i % 3, f"body-{i}" * 20, tags=f"t{i % 2}", keys=f"key-{i}"))
            assert r.ok
        wait_dispatched(store)
    return cfg.store_path_root_dir


def test_json_lines_list_every_record(store_dir: Path) -> None:
    out = _dump(str(store_dir), "--json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == N
    assert [r["keys"] for r in rows] == [f"key-{i}" for i in range(N)]
    assert all(r["crc_ok"] for r in rows)
    # Offsets are contiguous: each record starts where the previous one ended, or at a new segment.
    seg = 64 * 1024
    for a, b in zip(rows, rows[1:], strict=False):
        assert b["offset"] == a["offset"] + a["size"] or (b["offset"] % seg == 0 and b["offset"] > a["offset"])
    per_queue: dict[int, list[int]] = {}
    for r in rows:
        per_queue.setdefault(r["queue_id"], []).append(r["queue_offset"])
    assert all(offs == list(range(len(offs))) for offs in per_queue.values())


def test_table_and_filters(store_dir: Path) -> None:
    out = _dump(str(store_dir), "--limit", "5")
    assert out.returncode == 0, out.stderr
    assert "DumpTopic" in out.stdout and "key-4" in out.stdout and "key-5" not in out.stdout
    cq = _dump(str(store_dir), "--consume-queue", "--json")
    units = [json.loads(line) for line in cq.stdout.splitlines()]
    assert len(units) == N
    assert sorted(u["queue_offset"] for u in units if u["queue_id"] == 1) == list(range(N // 3))
    idx = _dump(str(store_dir), "--index", "--json")
    headers = [json.loads(line) for line in idx.stdout.splitlines()]
    # Two keys per message (UNIQ_KEY and KEYS), 255 usable entries per small index file.
    assert sum(h["index_count"] - 1 for h in headers) == 2 * N


def test_verify_clean_store(store_dir: Path) -> None:
    out = _dump(str(store_dir), "--verify")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{N} records checked, 0 problem(s)" in out.stdout


def test_verify_names_file_and_position_of_a_flipped_body_byte(store_dir: Path) -> None:
    rows = [json.loads(line) for line in _dump(str(store_dir), "--json").stdout.splitlines()]
    victim = rows[10]
    seg = store_dir / "commitlog" / victim["file"]
    body_pos = victim["position"] + 88  # IPv4 hosts: the body starts right after BODYLENGTH at 84
    data = bytearray(seg.read_bytes())
    data[body_pos] ^= 0xFF
    seg.write_bytes(bytes(data))
    out = _dump(str(store_dir), "--verify")
    assert out.returncode == 1
    assert f"{seg} @ {victim['position']} (offset {victim['offset']}): crc" in out.stdout


def test_verify_reports_a_broken_record_and_the_units_behind_it(store_dir: Path) -> None:
    rows = [json.loads(line) for line in _dump(str(store_dir), "--json").stdout.splitlines()]
    victim = rows[20]
    seg = store_dir / "commitlog" / victim["file"]
    data = bytearray(seg.read_bytes())
    data[victim["position"] + 4 : victim["position"] + 8] = b"\x00\x01\x02\x03"  # magic
    seg.write_bytes(bytes(data))
    out = _dump(str(store_dir), "--verify", "--json")
    assert out.returncode == 1
    problems = [json.loads(line) for line in out.stdout.splitlines()]
    assert problems[0]["file"] == str(seg) and problems[0]["position"] == victim["position"]
    assert problems[0]["kind"] == "record" and "bad magic" in problems[0]["detail"]
    assert any(p["kind"] == "consumequeue" for p in problems[1:])


def test_missing_dir_is_a_clear_error(tmp_path: Path) -> None:
    out = _dump(str(tmp_path / "nope"))
    assert out.returncode == 2 and "no such store directory" in out.stderr  # errors go to stderr


def test_piped_table_prints_long_topics_keys_and_paths_whole_on_one_line(tmp_path: Path) -> None:
    """In a pipe (an Airflow or CI log) each row is one line holding every value in full, whatever COLUMNS says."""
    topic = "Dump" + "t" * 120  # 124 characters: the longest V1 topic is 127
    key = "order-" + "k" * 90
    cfg = make_config(tmp_path / ("deep-" * 25))
    with MessageStore(cfg) as store:
        for i in range(3):
            assert store.put_message(make_message(topic, i, f"body-{i}", tags="TagA", keys=f"{key}-{i}")).ok
        wait_dispatched(store)
    root = cfg.store_path_root_dir
    env = {**os.environ, "COLUMNS": "60"}
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=120, env=env)

    records = run([str(MQLAKE), "store", "dump", str(root)])
    assert records.returncode == 0, records.stderr
    assert "…" not in records.stdout
    rows = [line for line in records.stdout.splitlines() if topic in line]
    assert len(rows) == 3 and all(f"{key}-{i}" in row and "TagA" in row for i, row in enumerate(rows))

    units = run([str(MQLAKE), "store", "dump", str(root), "--consume-queue", "--topic", topic])
    cells = [line.split()[:2] for line in units.stdout.splitlines() if topic in line]  # mqadmin's plain columns
    assert cells == [[topic, "0"], [topic, "1"], [topic, "2"]]

    seg = sorted((root / "commitlog").iterdir())[0]
    data = bytearray(seg.read_bytes())
    data[4:8] = b"\x00\x01\x02\x03"  # the first record's magic
    seg.write_bytes(bytes(data))
    verify = run([str(MQLAKE), "store", "dump", str(root), "--verify"])
    assert verify.returncode == 1
    assert f"{seg} @ 0 (offset 0): record: " in verify.stdout.splitlines()[0]
    assert any(line.startswith(str(root / "consumequeue" / topic)) for line in verify.stdout.splitlines())


def test_odd_entries_are_skipped_and_reported_never_a_traceback(store_dir: Path) -> None:
    """Badly named files and directories in a store (as a hostile name or an operator's leftover leaves them):
    --verify reports each on one line naming it and exits 1; a listing skips them and says so on stderr."""
    cq = store_dir / "consumequeue"
    odd = {
        cq / "DumpTopic" / "notanumber": "not a queue directory",
        cq / "DumpTopic" / "²": "not a queue directory",  # a digit to str.isdigit, not to int()
        cq / "stray.txt": "not a topic directory",
        store_dir / "commitlog" / "notes.txt": "not a segment",
        store_dir / "index" / "subdir": "not an IndexFile",
    }
    for path in odd:
        if path.suffix == ".txt":
            path.write_text("x")
        else:
            path.mkdir()
    short_index = store_dir / "index" / "20000101000000000"
    short_index.write_bytes(b"\1" * 10)

    out = _dump(str(store_dir), "--verify")
    assert out.returncode == 1 and "Traceback" not in out.stderr + out.stdout, out.stderr
    lines = out.stdout.splitlines()
    for path, what in odd.items():
        assert any(line.startswith(f"{path}: {what}") for line in lines), lines
    assert f"{short_index} @ 10 (offset 0): index: 10 bytes, shorter than its header" in lines
    assert f"{N} records checked, {len(odd) + 1} problem(s)" in out.stdout

    units = _dump(str(store_dir), "--consume-queue", "--json")
    assert units.returncode == 0 and "Traceback" not in units.stderr, units.stderr
    assert len(units.stdout.splitlines()) == N
    assert f"skipped {cq / 'DumpTopic' / 'notanumber'}: not a queue directory" in units.stderr
    headers = _dump(str(store_dir), "--index", "--json")
    assert headers.returncode == 0 and f"skipped {short_index}" in headers.stderr, headers.stderr


def test_a_name_too_long_for_the_file_system_is_one_error_line(tmp_path: Path) -> None:
    too_long = tmp_path / ("x" * 300)
    out = _dump(str(too_long), "--verify")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith(f"error: {too_long}: cannot read: File name too long")
    assert len(out.stderr.strip().splitlines()) <= 3  # one line, wrapped at most by the console width
