"""Rebuild ConsumeQueue and IndexFile from the CommitLog with Spark and verify the live files.

One store is written by the real MessageStore (many topics and queues, keys, UNIQ_KEYs, tags, delay-level
and transactional messages; small segment, ConsumeQueue and IndexFile sizes).  Each test damages its
own copy and asserts the report locates the damage: topic, queue, queue offset, file and position.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from store.dump import iter_records
from store.format import delay, hashing, properties, records, units
from tests.fixtures_spark import LONG_TOPIC, write_store
from tests.fixtures_vectors import java_string
from tests.helpers import SMALL_CONSUME_QUEUE, SMALL_HASH_SLOTS, make_config, make_message, read_queue

PER_FILE = SMALL_CONSUME_QUEUE // units.CQ_UNIT_SIZE


@pytest.fixture(scope="session")
def base_store(tmp_path_factory) -> Path:
    """The written store (its root); never modified by a test, copy it first."""
    from store.message_store import MessageStore

    root = tmp_path_factory.mktemp("rebuild")
    written = write_store(root, 1600)
    with MessageStore(make_config(root)) as store:
        for i in range(600):
            topic = ["Orders", "Invoices", "Refunds"][i % 3]
            msg = make_message(topic, i % 5, f"extra {i}", tags=f"t{i % 4}", keys=[f"x{i}", "shared"])
            assert store.put_message(msg).ok
        for i in range(12):  # a delay-level message's unit carries its deliver time as tagsCode
            msg = make_message(delay.SCHEDULE_TOPIC, 2, f"delayed {i}", tags="d", keys=f"dk{i}", DELAY="3")
            assert store.put_message(msg).ok
        for i, flag in enumerate([records.TRANSACTION_PREPARED_TYPE, records.TRANSACTION_ROLLBACK_TYPE] * 5):
            msg = make_message("Orders", 0, f"tx {i}", keys=f"tx{i}", sys_flag=flag)  # no unit; half ones indexed
            assert store.put_message(msg).ok
    return written.root


def copy_store(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(src, dst)
    return dst


def verify(spark, store_dir: Path, **kw) -> dict:
    """``verify_index`` on the given session (None: as the command would choose)."""
    from pipelines.index_rebuild.job import verify_index

    return verify_index(store_dir, spark=spark, **kw)


def queue(report: dict, topic: str, qid: int) -> dict:
    return next(q for q in report["consume_queues"] if q["topic"] == topic and q["queue_id"] == qid)


def bad_queues(report: dict) -> list[dict]:
    return [q for q in report["consume_queues"] if q["status"] != "ok"]


def bad_index(report: dict) -> list[dict]:
    return [r for r in report["index_files"] if r["status"] != "ok"]


def cq_file(store_dir: Path, topic: str, qid: int, n: int) -> Path:
    return sorted((store_dir / "consumequeue" / topic / str(qid)).iterdir())[n]


def consumable_by_queue(store_dir: Path) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """(queue offset, CommitLog offset) per queue, straight from the CommitLog records."""
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for r in iter_records(store_dir):
        assert isinstance(r, dict), r
        if records.is_consumable(r["sys_flag"]):
            out.setdefault((r["topic"], r["queue_id"]), []).append((r["queue_offset"], r["offset"]))
    return {k: sorted(v) for k, v in out.items()}


def index_headers(store_dir: Path) -> list[tuple[str, units.IndexHeader]]:
    return [(p.name, units.decode_index_header(p.read_bytes())) for p in sorted((store_dir / "index").iterdir())]


# =====================================================================================================


@pytest.mark.spark
def test_clean_store_verifies_through_the_cli_with_report_and_lake(spark, base_store, tmp_path):
    from deltalake import DeltaTable
    from typer.testing import CliRunner

    from cli.main import app

    store_dir = copy_store(base_store, tmp_path)
    report, lake = tmp_path / "report.json", tmp_path / "lake"
    res = CliRunner().invoke(app, ["verify-index", "--store-dir", str(store_dir), "--report", str(report),
                                   "--lake", str(lake), "--repair", "--out", str(tmp_path / "out")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "all match" in res.output
    rep = json.loads(report.read_text())
    expected = consumable_by_queue(store_dir)
    assert rep["summary"]["ok"] and not rep["broker_running"]
    assert rep["summary"]["index_rule"] == "4.x"  # its messages have tags, which the store does not index
    assert "RocketMQ 4.x index rule" in res.output
    assert {(q["topic"], q["queue_id"]) for q in rep["consume_queues"]} == set(expected)
    assert len(expected) >= 12 and (delay.SCHEDULE_TOPIC, 2) in expected
    for q in rep["consume_queues"]:
        assert q["matched"] == len(expected[(q["topic"], q["queue_id"])]) and q["files_identical"], q
    n_index = len(index_headers(store_dir))
    assert n_index > 10 and len(rep["index_files"]) == n_index
    assert all(r["identical"] for r in rep["index_files"])
    assert rep["summary"]["index_entries_matched"] == sum(h.index_count - 1 for _, h in index_headers(store_dir))

    # The rebuilt files are the store's own, byte for byte (index files keep their names when matched).
    out = tmp_path / "out"
    for f in (store_dir / "consumequeue").rglob("*"):
        if f.is_file():
            assert (out / f.relative_to(store_dir)).read_bytes() == f.read_bytes(), f
    assert sorted(p.name for p in (out / "index").iterdir()) == sorted(p.name for p in (store_dir / "index").iterdir())
    for f in (store_dir / "index").iterdir():
        assert (out / "index" / f.name).read_bytes() == f.read_bytes(), f

    rows = DeltaTable(str(lake / "index_verification")).to_pyarrow_table().to_pylist()
    assert len(rows) == len(expected) + n_index
    assert {r["kind"] for r in rows} == {"consume_queue", "index_file"} and all(r["ok"] for r in rows)
    assert {r["run_id"] for r in rows} == {rep["run_id"]}


@pytest.mark.spark
def test_rerun_under_a_run_id_replaces_its_rows_and_exit_zero_reports_without_failing(spark, base_store, tmp_path):
    """What an orchestrator relies on: a retried run leaves one set of rows; --exit-zero leaves the verdict
    to the report."""
    from deltalake import DeltaTable
    from typer.testing import CliRunner

    from cli.main import app

    store_dir = copy_store(base_store, tmp_path)
    lake = tmp_path / "lake"

    def verify_cli(*extra: str):
        return CliRunner().invoke(app, ["verify-index", "--store-dir", str(store_dir), "--lake", str(lake),
                                        "--report", str(tmp_path / "r.json"), *extra])  # fmt: skip

    def rows_by_run() -> dict[str, int]:
        runs: dict[str, int] = {}
        for r in DeltaTable(str(lake / "index_verification")).to_pyarrow_table(columns=["run_id"]).to_pylist():
            runs[r["run_id"]] = runs.get(r["run_id"], 0) + 1
        return runs

    assert verify_cli("--run-id", "nightly-1").exit_code == 0
    once = rows_by_run()["nightly-1"]
    assert verify_cli("--run-id", "nightly-1").exit_code == 0
    assert verify_cli("--run-id", "nightly-2").exit_code == 0
    assert rows_by_run() == {"nightly-1": once, "nightly-2": once}

    cq_file(store_dir, "Orders", 0, 1).unlink()
    assert verify_cli().exit_code == 1
    res = verify_cli("--exit-zero", "--run-id", "nightly-3")
    assert res.exit_code == 0 and not json.loads((tmp_path / "r.json").read_text())["summary"]["ok"]
    bad = verify_cli("--run-id", "x' OR '1'='1")
    assert bad.exit_code == 2 and "run id" in bad.output


@pytest.mark.integration
def test_python_module_entry_point_and_bad_input(base_store, tmp_path):
    import subprocess
    import sys

    from tests.helpers import cli_env

    res = subprocess.run([sys.executable, "-m", "pipelines.index_rebuild", "--store-dir", str(tmp_path / "nothing")],
                         capture_output=True, text=True, cwd=Path(__file__).parent.parent, env=cli_env(),
                         timeout=60)  # fmt: skip
    assert res.returncode == 2 and "has no commitlog directory" in res.stdout + res.stderr


@pytest.mark.unit
def test_a_stores_sizes_are_read_off_its_files(base_store):
    from store.file_sizes import infer_store_config

    written = make_config(base_store)
    cfg = infer_store_config(base_store)
    assert cfg.mapped_file_size_commit_log == written.mapped_file_size_commit_log
    assert cfg.mapped_file_size_consume_queue == written.mapped_file_size_consume_queue
    assert (cfg.max_hash_slot_num, cfg.max_index_num) == (written.max_hash_slot_num, written.max_index_num)


@pytest.mark.unit
def test_a_store_whose_sizes_cannot_be_read_is_a_clear_error(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app
    from store.errors import MQLakeError
    from store.file_sizes import StoreSizeError, infer_store_config

    (tmp_path / "commitlog").mkdir()
    (tmp_path / "index").mkdir()
    odd = tmp_path / "index" / "20240101000000000"
    odd.write_bytes(b"\0" * (units.index_file_size(0, 0) + 7))  # not 40 + 4 * slots + 20 * 4 * slots
    with pytest.raises(StoreSizeError, match="maxIndexNum") as e:
        infer_store_config(tmp_path)
    assert isinstance(e.value, MQLakeError) and isinstance(e.value, ValueError)
    res = CliRunner().invoke(app, ["verify-index", "--store-dir", str(tmp_path)])
    assert res.exit_code == 2 and f"error: {odd}: size" in res.output, res.output


@pytest.mark.spark
def test_unreadable_commitlog_record_is_named(spark, base_store, tmp_path):
    from pipelines.index_rebuild.job import VerifyError

    store_dir = copy_store(base_store, tmp_path)
    seg = sorted((store_dir / "commitlog").iterdir())[2]
    with open(seg, "r+b") as f:
        f.seek(records.MAGIC_POS)
        f.write(b"\xde\xad\xbe\xef")  # the segment's first record: bad magic
    with pytest.raises(VerifyError, match=seg.name):
        verify(spark, store_dir)


@pytest.mark.spark
def test_deleted_consume_queue_file(spark, base_store, tmp_path):
    store_dir = copy_store(base_store, tmp_path)
    victim = cq_file(store_dir, "Orders", 0, 1)
    victim.unlink()
    rep = verify(spark, store_dir)
    assert not rep["summary"]["ok"]
    [q] = bad_queues(rep)
    first = int(victim.name) // units.CQ_UNIT_SIZE
    assert (q["topic"], q["queue_id"], q["status"]) == ("Orders", 0, "mismatch")
    assert q["missing"] == PER_FILE and q["mismatched"] == q["extra"] == 0
    assert q["first_bad_queue_offset"] == first and q["files_missing"] == [victim.name]
    p = q["problems"][0]
    assert (p["kind"], p["queue_offset"], p["file"], p["position"]) == ("missing", first, str(victim), 0)
    assert not bad_index(rep)


@pytest.mark.spark
def test_flipped_bytes_in_one_unit(spark, base_store, tmp_path):
    store_dir = copy_store(base_store, tmp_path)
    victim = cq_file(store_dir, "Invoices", 3, 0)
    unit = 17
    data = bytearray(victim.read_bytes())
    data[unit * 20 + 9] ^= 0x5A  # inside the size field
    victim.write_bytes(bytes(data))
    rep = verify(spark, store_dir)
    [q] = bad_queues(rep)
    assert (q["topic"], q["queue_id"], q["mismatched"], q["missing"], q["extra"]) == ("Invoices", 3, 1, 0, 0)
    assert q["first_bad_queue_offset"] == unit and q["files_differing"] == [victim.name]
    p = q["problems"][0]
    assert (p["kind"], p["file"], p["position"], p["queue_offset"]) == ("mismatched", str(victim), unit * 20, unit)
    assert p["expected"]["commitlog_offset"] == p["actual"]["commitlog_offset"]
    assert p["expected"]["size"] != p["actual"]["size"]


@pytest.mark.spark
def test_truncated_consume_queue(spark, base_store, tmp_path):
    store_dir = copy_store(base_store, tmp_path)
    victim = cq_file(store_dir, "Payments", 1, -1)
    keep_units = 7
    total_units = len(consumable_by_queue(store_dir)[("Payments", 1)])
    base = int(victim.name) // units.CQ_UNIT_SIZE
    with open(victim, "r+b") as f:
        f.truncate(keep_units * 20 + 10)  # a torn unit at the end, too
    rep = verify(spark, store_dir)
    [q] = bad_queues(rep)
    assert (q["topic"], q["queue_id"]) == ("Payments", 1)
    assert q["missing"] == total_units - base - keep_units and q["first_bad_queue_offset"] == base + keep_units
    kinds = [p["kind"] for p in q["problems"]]
    assert "file_size" in kinds and "missing" in kinds
    size_problem = next(p for p in q["problems"] if p["kind"] == "file_size")
    assert size_problem["file"] == str(victim)


@pytest.mark.spark
def test_removed_index_file(spark, base_store, tmp_path):
    store_dir = copy_store(base_store, tmp_path)
    name, header = index_headers(store_dir)[3]
    (store_dir / "index" / name).unlink()
    rep = verify(spark, store_dir)
    assert not bad_queues(rep)
    [r] = bad_index(rep)
    assert r["status"] == "missing" and r["file"] is None
    assert (r["begin_phy_offset"], r["end_phy_offset"]) == (header.begin_phy_offset, header.end_phy_offset)
    assert r["missing"] == header.index_count - 1
    assert r["problems"][0]["kind"] == "missing_file"
    names = [n for n, _ in index_headers(store_dir)]
    assert names[2] < r["rebuilt_file"] < names[3]  # a repair names it by its first store time, in order
    assert sum(1 for x in rep["index_files"] if x["status"] == "ok") == len(rep["index_files"]) - 1


def _index_entry(path: Path, e: int) -> tuple[int, int, int, int]:
    return units.read_index_entry(path.read_bytes(), SMALL_HASH_SLOTS, e)


@pytest.mark.spark
def test_corrupted_slot(spark, base_store, tmp_path):
    store_dir = copy_store(base_store, tmp_path)
    name, header = index_headers(store_dir)[2]
    path = store_dir / "index" / name
    data = bytearray(path.read_bytes())
    last_hash = _index_entry(path, header.index_count - 1)[0]
    slot = last_hash % SMALL_HASH_SLOTS
    units.write_index_slot(data, slot, 0)  # the slot forgets its chain
    path.write_bytes(bytes(data))
    rep = verify(spark, store_dir)
    [r] = bad_index(rep)
    assert r["file"] == name and r["unreachable"] >= 1 and r["missing"] == r["mismatched"] == 0
    p = r["problems"][0]
    assert p["kind"] == "unreachable" and p["slot"] == slot and p["file"] == str(path)
    assert f"slot {slot} (byte {units.index_slot_position(slot)}) holds entry 0" in p["reason"]
    assert p["key"] and p["topic"] and p["commitlog_offset"] > 0


@pytest.mark.spark
def test_broken_chain(spark, base_store, tmp_path):
    store_dir = copy_store(base_store, tmp_path)
    name, header = index_headers(store_dir)[5]
    path = store_dir / "index" / name
    data = bytearray(path.read_bytes())
    # the newest entry whose chain continues: cut its link to older entries of the same slot
    e = next(e for e in range(header.index_count - 1, 0, -1) if _index_entry(path, e)[3] > 0)
    h, phy, tdiff, prev = _index_entry(path, e)
    units.pack_index_entry_into(data, SMALL_HASH_SLOTS, e, h, phy, tdiff, 0)
    path.write_bytes(bytes(data))
    rep = verify(spark, store_dir)
    assert rep["summary"]["index_rule"] == "4.x"  # still judged by the store's rule
    [r] = bad_index(rep)
    assert r["file"] == name and r["unreachable"] >= 1
    lost = {p["entry"] for p in r["problems"] if p["kind"] == "unreachable"}
    assert prev in lost
    p = next(p for p in r["problems"] if p["entry"] == prev)
    assert f"chain broken at entry {e} (byte {units.index_entry_position(SMALL_HASH_SLOTS, e) + 16})" in p["reason"]


# the base store parks records on SCHEDULE_TOPIC_XXXX without a real topic: a broker on it discards them
@pytest.mark.expected_errors("real topic is SCHEDULE_TOPIC_XXXX; discarded")
@pytest.mark.spark
def test_repair_then_adopt_restores_a_store_that_serves_and_verifies(spark, base_store, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app
    from pipelines.index_rebuild.adopt import adopt_index
    from store.checkpoint import StoreLock, StoreLockedError
    from store.message_store import MessageStore

    store_dir = copy_store(base_store, tmp_path)
    expected = consumable_by_queue(store_dir)
    cq_file(store_dir, "Orders", 0, 0).unlink()  # loses the queue's head: the store cannot rebuild that itself
    victim = cq_file(store_dir, "Refunds", 4, 0)
    data = bytearray(victim.read_bytes())
    data[3 * 20 : 3 * 20 + 8] = (10**9).to_bytes(8, "big")  # unit 3 points far away
    victim.write_bytes(bytes(data))
    names = [n for n, _ in index_headers(store_dir)]
    (store_dir / "index" / names[1]).unlink()
    out = tmp_path / "rebuilt"
    rep = verify(spark, store_dir, repair_out=out)
    assert {(q["topic"], q["queue_id"]) for q in bad_queues(rep)} == {("Orders", 0), ("Refunds", 4)}
    assert len(bad_index(rep)) == 1

    assert make_config(tmp_path).store_path_root_dir == store_dir
    lock = StoreLock(store_dir)  # what a running broker holds: adoption refuses and changes nothing
    try:
        with pytest.raises(StoreLockedError):
            adopt_index(store_dir, out)
        res = CliRunner().invoke(app, ["store", "adopt-index", "--store-dir", str(store_dir), "--from", str(out)])
        assert res.exit_code == 1 and "locked" in res.output, res.output
    finally:
        lock.release()
    assert victim.read_bytes() == bytes(data) and not (tmp_path / "store" / "index-backup").exists()

    result = adopt_index(store_dir, out)
    assert (result.backup / "consumequeue" / "Refunds" / "4" / victim.name).read_bytes() == bytes(data)
    assert sorted(p.name for p in (result.backup / "index").iterdir()) == sorted(set(names) - {names[1]})
    installed = sorted(p.name for p in (store_dir / "index").iterdir())
    assert len(installed) == len(names) and installed[0] == names[0] and installed[2:] == names[2:]
    assert names[0] < installed[1] < names[2]

    with MessageStore(make_config(tmp_path)) as store:
        for (topic, qid), want in expected.items():
            got = [(q, rec.physical_offset) for q, rec in read_queue(store, topic, qid)]
            assert got == want, (topic, qid)
        # the restored index answers key queries: every message of a key from the removed file's range
        h = units.decode_index_header((store_dir / "index" / installed[1]).read_bytes())
        rec = next(r for r in iter_records(store_dir) if isinstance(r, dict) and r["offset"] == h.end_phy_offset)
        key = rec["keys"].split()[0]  # unique per message in this store
        found = store.query_message(rec["topic"], key, 64, 0, 2**62).messages
        assert rec["offset"] in {records.decode_record(m).physical_offset for m in found}
    rep2 = verify(spark, store_dir)
    assert rep2["summary"]["ok"], (bad_queues(rep2), bad_index(rep2))


@pytest.mark.spark
def test_tiered_store_verifies_from_the_local_minimum(spark, base_store, tmp_path):
    from pipelines.compaction.deletion import delete_tiered
    from store.retention import SegmentManifest

    store_dir = copy_store(base_store, tmp_path)
    manifest = SegmentManifest(store_dir)
    claimed = manifest.claim("test:tier", treat_sealed_as_expired=True)
    for seg in claimed[:5]:
        manifest.mark_tiered(seg.base_offset, "test:tier")
    for seg in claimed[5:]:
        manifest.release(seg.base_offset, "test:tier")
    deleted = delete_tiered(store_dir)  # the store's own deletion path
    assert len(deleted) == 5
    cl_min = min(int(p.name) for p in (store_dir / "commitlog").iterdir())
    assert cl_min == claimed[5].base_offset
    rep = verify(spark, store_dir)
    assert rep["summary"]["ok"], (bad_queues(rep), bad_index(rep))
    assert rep["commitlog"]["min_offset"] == cl_min
    assert sum(q["expected_gone"] for q in rep["consume_queues"]) > 0  # units of tiered data, not errors
    orders = queue(rep, "Orders", 0)
    assert orders["verified_from"] > 0 and orders["matched"] > 0
    first_index = rep["index_files"][0]
    assert first_index["carried"] > 0 or first_index["begin_phy_offset"] >= cl_min


# the base store parks records on SCHEDULE_TOPIC_XXXX without a real topic: a broker on it discards them
@pytest.mark.expected_errors("real topic is SCHEDULE_TOPIC_XXXX; discarded")
@pytest.mark.spark
def test_running_broker_is_verified_up_to_the_dispatched_offset(spark, base_store, tmp_path):
    import threading

    from store.message_store import MessageStore
    from tests.helpers import Worker, wait_dispatched, wait_until

    store_dir = copy_store(base_store, tmp_path)
    stop = threading.Event()
    written = []

    def producer(store: MessageStore) -> None:  # keeps appending while the verification runs
        i = 0
        while not stop.is_set():
            assert store.put_message(make_message("Orders", 1, f"live {i}", keys=f"live{i}")).ok
            written.append(i)
            i += 1
            stop.wait(0.002)

    with MessageStore(make_config(tmp_path)) as store:
        t = Worker(producer, store)
        t.start()
        try:
            wait_until(lambda: t.check() or len(written) > 20, what="the producer to start")
            rep = verify(spark, store_dir)
            wait_until(lambda: t.check() or store.max_phy_offset > rep["dispatched_bound"],
                       what="appends after the bound")  # fmt: skip
        finally:
            stop.set()
            t.finish()
        wait_dispatched(store)
        final_max = store.max_phy_offset
    assert rep["broker_running"] and 0 < rep["dispatched_bound"] < final_max
    assert rep["summary"]["ok"], json.dumps([{k: r[k] for k in ("header", "problems", "identical", "matched",
                                                                  "not_judged")} for r in bad_index(rep)])[:3000]
    assert rep["commitlog"]["end_offset"] <= rep["dispatched_bound"]
    assert queue(rep, "Orders", 1)["matched"] > 0
    after = verify(spark, store_dir)  # stopped now: everything is judged, and it all matches
    assert after["summary"]["ok"] and not after["broker_running"] and after["commitlog"]["end_offset"] == final_max


@pytest.mark.integration
def test_vectorised_index_key_hash_equals_the_java_hash(rmq):
    import pyarrow as pa

    # IndexFile.indexKeyHashMethod's own values (tests/java/vectors/FormatVectors.java): ASCII, multi-byte and
    # surrogate-pair keys, longer than 256 UTF-16 units, and "polygenelubricants", whose hashCode is
    # Integer.MIN_VALUE (abs stays negative -> 0). A lone surrogate is a Java String but no UTF-8 key, so it
    # cannot reach an IndexFile.
    strings = [(java_string(v["utf16"]), v["index_key_hash"]) for v in rmq["format"]["string_hash"]]
    assert any(_lone_surrogate(k) for k, _ in strings)
    cases = [(k, want) for k, want in strings if not _lone_surrogate(k)]
    assert ("polygenelubricants", 0) in cases and any(not k.isascii() for k, _ in cases)
    keys = [k for k, _ in cases]
    arr = pa.array(["pad"] + keys).slice(1)  # a sliced array: offsets not starting at 0
    assert list(hashing.index_key_hashes(arr)) == [want for _, want in cases]


def _lone_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@pytest.mark.spark
def test_verify_index_piped_to_a_file_names_the_broken_topic_and_queue_in_full(spark, base_store, tmp_path):
    """What an Airflow or CI log holds: each mismatch one line with the topic, queue and file whole."""
    import os
    import subprocess
    import sys

    from typer.testing import CliRunner

    from cli.main import app
    from tests.fixtures_spark import LONG_TOPIC  # 154 characters

    deep = tmp_path / ("a-long-directory-name-" * 8)
    env = {**os.environ, "COLUMNS": "80", "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"}
    mqlake = str(Path(sys.executable).with_name("mqlake"))

    nothing = deep / "nothing"
    bad = subprocess.run([sys.executable, "-m", "pipelines.index_rebuild", "--store-dir", str(nothing)],
                         capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and f"error: {nothing} has no commitlog directory\n" in bad.stderr

    store_dir = copy_store(base_store, deep)
    victim = cq_file(store_dir, LONG_TOPIC, 3, 1)
    victim.unlink()
    out = tmp_path / "verify.log"
    with open(out, "w") as f:
        res = subprocess.run([mqlake, "verify-index", "--store-dir", str(store_dir), "--master", "local[1]"],
                             stdout=f, stderr=subprocess.PIPE, text=True, env=env, timeout=300)  # fmt: skip
    assert res.returncode == 1, res.stderr[-4000:]
    text = out.read_text()
    assert "…" not in text
    [row] = [line for line in text.splitlines() if f"{LONG_TOPIC}-3" in line]
    cells = re.split(r"\s{2,}", row.strip())  # mqadmin's plain columns: two spaces or more between cells
    assert cells[:3] == ["ConsumeQueue", f"{LONG_TOPIC}-3", "mismatch"]
    assert cells[-1].startswith(f"missing {victim} topic={LONG_TOPIC} queue_id=3 queue_offset={PER_FILE} ")
    assert "MISMATCH: " in text

    as_json = CliRunner().invoke(app, ["verify-index", "--store-dir", str(store_dir), "--json"])
    assert as_json.exit_code == 1, as_json.output
    [q] = bad_queues(json.loads(as_json.stdout))
    assert (q["topic"], q["queue_id"], q["files_missing"]) == (LONG_TOPIC, 3, [victim.name])


@pytest.mark.spark
def test_a_topic_no_directory_can_hold_and_odd_entries_are_reported_not_a_traceback(spark, base_store, tmp_path):
    """A record whose topic is too long for a directory name (as an unchecked name can leave in a CommitLog), and
    badly named entries under consumequeue/: verify-index reports each (the record by file and offset) and exits
    1; its repair leaves that queue out."""
    import dataclasses
    import time

    from typer.testing import CliRunner

    from cli.main import app

    store_dir = copy_store(base_store, tmp_path)
    last = [r for r in iter_records(store_dir) if isinstance(r, dict)][-1]
    end = last["offset"] + last["size"]
    seg = store_dir / "commitlog" / last["file"]
    topic = "L" * 300
    rec = dataclasses.replace(make_message(topic, 0, "unnamable", keys="kl"), physical_offset=end,
                              store_timestamp=int(time.time() * 1000))  # fmt: skip
    data = records.encode_record(rec)
    assert end - int(seg.name) + len(data) < seg.stat().st_size
    with open(seg, "r+b") as f:
        f.seek(end - int(seg.name))
        f.write(data)
    odd = [store_dir / "consumequeue" / "Orders" / "notanumber", store_dir / "consumequeue" / "Orders" / "²"]
    for d in odd:
        d.mkdir()

    report = tmp_path / "report.json"
    res = CliRunner().invoke(app, ["verify-index", "--store-dir", str(store_dir), "--report", str(report),
                                   "--repair", "--out", str(tmp_path / "out")])  # fmt: skip
    assert res.exit_code == 1, res.output
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), res.exception
    rep = json.loads(report.read_text())
    [q] = bad_queues(rep)
    assert (q["topic"], q["queue_id"], q["status"]) == (topic, 0, "bad_topic_name")
    [p] = q["problems"]
    assert (p["kind"], p["file"], p["position"], p["commitlog_offset"]) == (
        "topic_name", str(seg), end - int(seg.name), end
    )
    assert "longer than 255 bytes" in p["detail"]
    assert f"topic_name {seg}" in res.output and f"commitlog_offset={end}" in res.output
    assert sorted(rep["skipped"]) == sorted(f"{d}: not a queue directory (name must be a queue id)" for d in odd)
    assert all(f"skipped {d}" in res.output for d in odd)
    # every other queue still verifies, and the repair holds every queue but that one
    assert all(x["status"] == "ok" for x in rep["consume_queues"] if x["topic"] != topic)
    manifest = json.loads((tmp_path / "out" / "repair.json").read_text())
    assert {x["topic"] for x in manifest["consume_queues"]} == {x["topic"] for x in rep["consume_queues"]} - {topic}
    assert not (tmp_path / "out" / "consumequeue" / "L").exists()


# ===================================================================================================== local engine


def _strip_run(report: dict) -> dict:
    """A report without what differs between two runs of the same verification (its id, time and engine)."""
    return {k: v for k, v in report.items() if k not in ("run_id", "started_at", "timings", "engine")}


@pytest.mark.unit
def test_compiled_scan_gives_the_reference_rows(base_store, tmp_path):
    """Every record, the compiled scan's or handed back to the reference (a non-ASCII topic, tags or keys, an
    empty TAGS after a set one, a delay level's tags code, a rollback, a torn tail), comes out as the reference's."""
    import pyarrow as pa

    from pipelines.index_rebuild import scan
    from store.message_store import MessageStore

    root = tmp_path / "store"
    with MessageStore(make_config(tmp_path)) as store:
        for i in range(300):
            msg = make_message(["Plain", "Dörfer", LONG_TOPIC][i % 3], i % 2, f"b{i}", tags=["t", "tæg", None][i % 3],
                               keys=[f"k{i}", "ключ" if i % 5 == 0 else "", "two  spaces"])  # fmt: skip
            assert store.put_message(msg).ok
        msg = make_message("Plain", 0, "empty tags last", tags="first")
        msg.properties += properties.encode_properties({"TAGS": ""})
        assert store.put_message(msg).ok
        for flag in (records.TRANSACTION_ROLLBACK_TYPE, records.TRANSACTION_PREPARED_TYPE):
            assert store.put_message(make_message("Plain", 1, "tx", tags="x", keys="txk", sys_flag=flag)).ok
        assert store.put_message(make_message(delay.SCHEDULE_TOPIC, 1, "later", tags="d", DELAY="2")).ok
        end = store.max_phy_offset
    segments = sorted((root / "commitlog").iterdir())
    last = max(f for f in segments if int(f.name) < end)
    for f in segments[segments.index(last) + 1 :]:
        f.unlink()  # allocated ahead, empty
    with open(last, "r+b") as f:  # a torn tail: half a record's header, nothing valid after it
        f.seek(end - int(last.name))
        f.write(b"\x00\x00\x01\x00\xda\xa3\x20\xa7")
    for store_dir in (root, base_store):
        for path, start, stop, is_last in scan.splits(store_dir, split_size=4096):
            both = [pa.Table.from_batches(list(scan.read_split(path, start, stop, last=is_last, compiled=c)),
                                          scan.DISPATCH_SCHEMA) for c in (True, False)]  # fmt: skip
            assert both[0].equals(both[1]), (path, start)
    rows = scan.scan_local(root).table
    assert rows.num_rows == 304
    assert pa.compute.any(rows.column("tag_key")).as_py()


@pytest.mark.unit
def test_the_command_scans_locally_by_default_and_names_the_damage(base_store, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app
    from pipelines.index_rebuild.job import VerifyError, verify_index

    store_dir = copy_store(base_store, tmp_path)
    victim = cq_file(store_dir, "Orders", 1, 0)
    victim.unlink()
    res = CliRunner().invoke(app, ["verify-index", "--store-dir", str(store_dir), "--json"])
    assert res.exit_code == 1, res.output
    rep = json.loads(res.output)
    assert rep["engine"] == "local"
    [q] = bad_queues(rep)
    assert (q["topic"], q["queue_id"], q["files_missing"]) == ("Orders", 1, [victim.name])
    seg = sorted((store_dir / "commitlog").iterdir())[1]
    with open(seg, "r+b") as f:
        f.seek(records.MAGIC_POS)
        f.write(b"\xde\xad\xbe\xef")  # the segment's first record: bad magic
    with pytest.raises(VerifyError, match=f"{seg.name}.*bad magic"):
        verify_index(store_dir)
    with pytest.raises(VerifyError, match="engine 'gpu'"):
        verify_index(store_dir, engine="gpu")


@pytest.mark.spark
def test_local_engine_gives_the_spark_report_on_damaged_files(spark, base_store, tmp_path):
    """A flipped ConsumeQueue unit, a truncated queue and a broken IndexFile chain: the same report either way."""
    store_dir = copy_store(base_store, tmp_path)
    victim = cq_file(store_dir, "Invoices", 2, 0)
    data = bytearray(victim.read_bytes())
    data[5 * 20 + 9] ^= 0x5A
    victim.write_bytes(bytes(data))
    short = cq_file(store_dir, "Refunds", 4, 0)
    short.write_bytes(short.read_bytes()[: 7 * 20])
    name, header = index_headers(store_dir)[3]
    path = store_dir / "index" / name
    raw = bytearray(path.read_bytes())
    e = next(e for e in range(header.index_count - 1, 0, -1) if _index_entry(path, e)[3] > 0)
    h, phy, tdiff, _prev = _index_entry(path, e)
    units.pack_index_entry_into(raw, SMALL_HASH_SLOTS, e, h, phy, tdiff, 0)
    path.write_bytes(bytes(raw))
    local = verify(None, store_dir, engine="local")
    on_spark = verify(spark, store_dir)
    assert (local["engine"], on_spark["engine"]) == ("local", "spark")
    assert not local["summary"]["ok"] and len(bad_queues(local)) == 2 and len(bad_index(local)) == 1
    assert _strip_run(local) == _strip_run(on_spark)
