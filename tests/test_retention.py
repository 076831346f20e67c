"""Retention: expired segments, the segment manifest (segments.json) and its claim/mark protocol.

The store runs in the test process; tiering jobs are other processes working on the same manifest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store.config import ExpiredSegmentPolicy, MessageStoreConfig
from store.format import records, units
from store.message_store import GetMessageStatus, MessageStore, PutMessageStatus
from store.retention import ManifestError, SegmentManifest, SegmentState, claimer_id, disk_used_ratio
from tests.helpers import make_config, make_message, wait_dispatched

REPO = Path(__file__).resolve().parents[1]
TOPIC = "RetentionTopic"
QUEUES = 3

# A tiering job: takes JSON commands on stdin, answers one JSON line each, as the owner claimer_id(run).
CLAIMER = r"""
import json, sys
from store.retention import ManifestError, SegmentManifest, claimer_id
m = SegmentManifest(sys.argv[1])
owner = claimer_id(sys.argv[2])
print(json.dumps({"owner": owner}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    op, kw = cmd["op"], cmd.get("kw", {})
    if op == "exit":
        break
    try:
        if op == "claim":
            res = [e.model_dump(mode="json") for e in m.claim(owner, **kw)]
        else:
            res = getattr(m, op)(cmd["base"], owner, **kw).model_dump(mode="json")
        out = {"ok": res}
    except ManifestError as e:
        out = {"error": str(e)}
    print(json.dumps(out), flush=True)
"""


class Claimer:
    """Another process holding claims on the manifest."""

    def __init__(self, root: Path, run_id: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(root), run_id],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.owner = self._read()["owner"]
        assert f":{self.proc.pid}:{run_id}" in self.owner

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"claimer exited with {self.proc.poll()}"
        return json.loads(line)

    def call(self, op: str, base: int | None = None, **kw):
        self.proc.stdin.write(json.dumps({"op": op, "base": base, "kw": kw}) + "\n")
        self.proc.stdin.flush()
        out = self._read()
        if "error" in out:
            raise ManifestError(out["error"])
        return out["ok"]

    def exit(self) -> None:
        """Leave without marking anything (a job that died mid-run)."""
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.proc.stdin.close()
        assert self.proc.wait(timeout=20) == 0
        self.proc.stdout.close()


@pytest.fixture
def claimers():
    made: list[Claimer] = []

    def factory(root: Path, run_id: str) -> Claimer:
        c = Claimer(root, run_id)
        made.append(c)
        return c

    yield factory
    for c in made:
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait(timeout=20)
        for stream in (c.proc.stdin, c.proc.stdout):
            if not stream.closed:
                stream.close()


def manifest_states(root: Path) -> dict[int, str]:
    """The manifest as the file holds it."""
    raw = json.loads((root / "segments.json").read_text(encoding="utf-8"))
    return {int(name): e["state"] for name, e in raw["segments"].items()}


def segment_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if len(p.name) == 20 and p.name.isdigit())


class Filled:
    """A running store filled with ``segments`` sealed CommitLog segments and an active one."""

    def __init__(self, cfg: MessageStoreConfig, segments: int, body_size: int = 300) -> None:
        self.cfg = cfg
        self.store = MessageStore(cfg).start()
        self.puts: list[tuple[int, int, int, int, bytes]] = []  # queue, queue offset, phy offset, size, body
        seg_size = cfg.mapped_file_size_commit_log
        i = 0
        while self.store.max_phy_offset < segments * seg_size + 4096:
            q = i % QUEUES
            body = f"m{i}-".encode() * (body_size // 6) + os.urandom(i % 7)
            res = self.store.put_message(make_message(TOPIC, q, body, tags=f"t{q}", keys=f"key-{i}"))
            assert res.ok
            self.puts.append((q, res.append.queue_offset, res.append.wrote_offset, res.append.wrote_bytes, body))
            i += 1
        wait_dispatched(self.store)
        self.store.commitlog.queue.wait_preallocated()  # the segment written ahead is on disk before any listing
        self.bases = [mf.file_from_offset for mf in self.store.commitlog.queue.files]
        assert len(self.bases) == segments + 1
        self.sealed, self.active = self.bases[:-1], self.bases[-1]

    def first_offset_at_or_after(self, q: int, phy_min: int) -> int:
        return min(qoff for qq, qoff, phy, _size, _body in self.puts if qq == q and phy >= phy_min)

    def assert_reads(self, min_phy: int) -> None:
        """Reads below the new minimum answer OFFSET_TOO_SMALL; from the minimum on they return the data."""
        s = self.store
        for q in range(QUEUES):
            lo = self.first_offset_at_or_after(q, min_phy)
            assert s.get_min_offset_in_queue(TOPIC, q) == lo, f"queue {q}"
            if lo > 0:
                for off in (0, lo - 1):
                    res = s.get_message(TOPIC, q, off, 1)
                    assert res.status == GetMessageStatus.OFFSET_TOO_SMALL and res.next_begin_offset == lo
            bodies = {qoff: body for qq, qoff, _phy, _size, body in self.puts if qq == q}
            for off in (lo, lo + 1, max(bodies)):
                res = s.get_message(TOPIC, q, off, 1)
                assert res.status == GetMessageStatus.FOUND, f"queue {q} offset {off}: {res.status}"
                assert records.decode_record(res.messages[0]).body == bodies[off]

    def close(self) -> None:
        self.store.shutdown()


@pytest.fixture
def filled(tmp_path):
    # Ages and the deletion hour decide here, not this machine's disk: the stores read a half-full disk
    # (tests/host_disk.py; a test may patch it again for its own figures).
    made: list[Filled] = []

    def factory(segments: int = 4, **overrides) -> Filled:
        overrides.setdefault("file_reserved_time", 0)
        overrides.setdefault("clean_file_forcibly_enable", False)
        f = Filled(make_config(tmp_path, **overrides), segments)
        made.append(f)
        return f

    yield factory
    for f in made:
        f.close()


# ---------------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_sealed_segments_expire_and_stay_on_disk_under_tier_policy(filled):
    f = filled(segments=4)
    root = f.cfg.store_path_root_dir
    assert f.cfg.expired_segment_policy == ExpiredSegmentPolicy.TIER
    files_before = segment_names(f.cfg.commitlog_dir)
    assert f.store.clean_expired_files() == []
    states = manifest_states(root)
    assert {b: states[b] for b in f.bases} == {**{b: "expired" for b in f.sealed}, f.active: "active"}

    f.store.delete_expired_files_manually()
    f.store.delete_expired_files_manually()
    assert segment_names(f.cfg.commitlog_dir) == files_before, "untiered segments must never leave the disk"
    assert {b: manifest_states(root)[b] for b in f.bases} == {**{b: "expired" for b in f.sealed}, f.active: "active"}
    assert f.store.min_phy_offset == 0
    f.assert_reads(0)


@pytest.mark.integration
def test_claim_mark_and_delete_from_another_process(filled, claimers):
    f = filled(segments=5)
    root, cfg, store = f.cfg.store_path_root_dir, f.cfg, f.store
    store.clean_expired_files()
    a = claimers(root, "run-a")
    claimed = a.call("claim")
    assert [e["base_offset"] for e in claimed] == f.sealed, "every expired segment, oldest first"
    assert all(e["state"] == "tiering" and e["claimed_by"] == a.owner for e in claimed)
    assert claimers(root, "run-b").call("claim") == [], "a live claimer's segments are not handed out twice"
    assert {b: s for b, s in manifest_states(root).items() if b in f.sealed} == {b: "tiering" for b in f.sealed}

    tiered = f.sealed[:3]
    for base in tiered:
        e = a.call("mark_tiered", base, note="delta v7")
        assert e["state"] == "tiered" and e["claimed_by"] is None
    cq_files = {q: segment_names(cfg.consume_queue_dir / TOPIC / str(q)) for q in range(QUEUES)}
    idx_before = {p.name: units.decode_index_header(p.read_bytes()) for p in cfg.index_dir.iterdir()}

    store.delete_expired_files_manually()
    new_min = tiered[-1] + cfg.mapped_file_size_commit_log
    assert store.min_phy_offset == new_min
    assert segment_names(cfg.commitlog_dir)[0] == units.offset_to_file_name(new_min)
    for base in tiered:
        assert not (cfg.commitlog_dir / units.offset_to_file_name(base)).exists()
    states = manifest_states(root)
    assert {b: states[b] for b in f.bases} == {
        **{b: "deleted" for b in tiered}, **{b: "tiering" for b in f.sealed[3:]}, f.active: "active"}  # fmt: skip

    # ConsumeQueue files whose every unit points below the new minimum are gone (never the last one)
    units_per_file = cfg.mapped_file_size_consume_queue // units.CQ_UNIT_SIZE
    ends = {(q, qoff): phy + size for q, qoff, phy, size, _b in f.puts}
    removed_cq = 0
    for q, names in cq_files.items():
        expected = [
            name for i, name in enumerate(names)
            if i == len(names) - 1
            or ends[(q, (int(name) // units.CQ_UNIT_SIZE) + units_per_file - 1)] > new_min
        ]  # fmt: skip
        removed_cq += len(names) - len(expected)
        assert segment_names(cfg.consume_queue_dir / TOPIC / str(q)) == expected, f"queue {q}"
    assert removed_cq > 0
    # index files whose entries all lie below the new minimum are gone, the rest stay
    expected_idx = sorted(n for n, h in idx_before.items() if h.end_phy_offset >= new_min)
    assert len(expected_idx) < len(idx_before)
    assert sorted(p.name for p in cfg.index_dir.iterdir()) == expected_idx
    f.assert_reads(new_min)

    # the next job finishes the rest once the first has let go
    for base in f.sealed[3:]:
        assert a.call("release", base)["state"] == "sealed"
    b = claimers(root, "run-c")
    assert b.call("claim") == [], "released segments wait for the store to expire them again"
    store.clean_expired_files()
    assert [e["base_offset"] for e in b.call("claim")] == f.sealed[3:]
    for base in f.sealed[3:]:
        b.call("mark_tiered", base)
    store.delete_expired_files_manually()
    assert store.min_phy_offset == f.active
    f.assert_reads(f.active)

    # a restart keeps the new minimum and the manifest
    store.shutdown()
    f.store = store = MessageStore(cfg).start()
    assert store.min_phy_offset == f.active
    states = manifest_states(root)
    assert {b: states[b] for b in f.bases} == {**{b: "deleted" for b in f.sealed}, f.active: "active"}
    f.assert_reads(f.active)


@pytest.mark.unit
def test_only_a_tiered_prefix_is_deleted(filled, tmp_path):
    f = filled(segments=3)
    root, cfg = f.cfg.store_path_root_dir, f.cfg
    f.store.clean_expired_files()
    m = SegmentManifest(root)
    owner = claimer_id("prefix")
    assert [e.base_offset for e in m.claim(owner, limit=2)] == f.sealed[:2]
    m.mark_quarantined(f.sealed[0], owner, "row count mismatch: 10 != 11")
    m.mark_tiered(f.sealed[1], owner)
    files = segment_names(cfg.commitlog_dir)

    f.store.delete_expired_files_manually()
    assert segment_names(cfg.commitlog_dir) == files, "deletion stops at the first segment not tiered"
    states = manifest_states(root)
    assert (states[f.sealed[0]], states[f.sealed[1]], states[f.sealed[2]]) == ("quarantined", "tiered", "expired")
    assert m.get(f.sealed[0]).note == "row count mismatch: 10 != 11"
    f.assert_reads(0)
    # a later job gets only the expired segment: quarantined and tiered ones are not claimable
    assert [e.base_offset for e in m.claim(claimer_id("next"))] == [f.sealed[2]]
    # not even RocketMQ's classic policy deletes a quarantined segment, or anything after it
    f.store.shutdown()
    f.store = MessageStore(make_config(tmp_path, file_reserved_time=0, expired_segment_policy="delete")).start()
    f.store.delete_expired_files_manually()
    assert segment_names(cfg.commitlog_dir)[:2] == files[:2]
    assert manifest_states(root)[f.sealed[0]] == "quarantined"
    f.assert_reads(0)


@pytest.mark.integration
def test_dead_claimers_segments_are_taken_over(filled, claimers):
    f = filled(segments=3)
    root = f.cfg.store_path_root_dir
    f.store.clean_expired_files()
    dead = claimers(root, "dies")
    assert [e["base_offset"] for e in dead.call("claim")] == f.sealed
    dead.exit()  # gone without marking anything
    m = SegmentManifest(root)
    assert all(m.get(b).state == SegmentState.TIERING and m.get(b).claimed_by == dead.owner for b in f.sealed)

    heir = claimer_id("heir")
    taken = m.claim(heir)
    assert [e.base_offset for e in taken] == f.sealed and all(e.claimed_by == heir for e in taken)
    with pytest.raises(ManifestError):
        m.mark_tiered(f.sealed[0], dead.owner)
    m.mark_tiered(f.sealed[0], heir)

    # a live claimer keeps its claims until its lease runs out
    late = claimers(root, "late")
    assert late.call("claim") == []
    assert [e["base_offset"] for e in late.call("claim", lease_s=0.0)] == f.sealed[1:]
    with pytest.raises(ManifestError):
        m.mark_tiered(f.sealed[1], heir)
    for base in f.sealed[1:]:
        late.call("mark_tiered", base)
    f.store.delete_expired_files_manually()
    assert f.store.min_phy_offset == f.active
    f.assert_reads(f.active)


@pytest.mark.unit
def test_treat_sealed_as_expired_never_claims_the_active_segment(filled):
    f = filled(segments=3, file_reserved_time=72)
    root = f.cfg.store_path_root_dir
    f.store.clean_expired_files()
    states = manifest_states(root)
    assert {b: states[b] for b in f.bases} == {**{b: "sealed" for b in f.sealed}, f.active: "active"}
    m = SegmentManifest(root)
    owner = claimer_id("eager")
    assert m.claim(owner) == [], "sealed but unexpired segments are not claimable by default"
    got = m.claim(owner, treat_sealed_as_expired=True)
    assert [e.base_offset for e in got] == f.sealed
    assert all(e.state == SegmentState.TIERING for e in got)
    assert m.claim(claimer_id("other"), treat_sealed_as_expired=True) == []
    for base in f.sealed:
        m.mark_tiered(base, owner)
    assert m.claim(claimer_id("again"), treat_sealed_as_expired=True) == []
    assert manifest_states(root)[f.active] == "active"
    # once the store rolls to a new segment, the old active one is sealed and claimable; the new one is not
    while len(f.store.commitlog.queue.files) == len(f.bases):
        assert f.store.put_message(make_message(TOPIC, 0, b"roll" * 100)).ok
    wait_dispatched(f.store)
    f.store.clean_expired_files()
    new_active = f.store.commitlog.queue.files[-1].file_from_offset
    assert manifest_states(root)[new_active] == "active"
    assert [e.base_offset for e in m.claim(owner, treat_sealed_as_expired=True)] == [f.active]
    m.release(f.active, owner)
    f.store.delete_expired_files_manually()
    assert f.store.min_phy_offset == f.active
    assert segment_names(f.cfg.commitlog_dir)[0] == units.offset_to_file_name(f.active)
    f.assert_reads(f.active)


@pytest.mark.unit
def test_delete_policy_deletes_expired_segments_without_tiering(filled, pinned_zone):
    hour = time.localtime().tm_hour
    f = filled(segments=3, expired_segment_policy="delete", delete_when=f"{(hour + 2) % 24:02d}")
    root, cfg = f.cfg.store_path_root_dir, f.cfg
    # outside the deletion hour, with room on disk, an automatic pass only expires
    assert f.store.clean_expired_files() == []
    states = manifest_states(root)
    assert {b: states[b] for b in f.bases} == {**{b: "expired" for b in f.sealed}, f.active: "active"}
    f.store.delete_expired_files_manually()
    assert f.store.min_phy_offset == f.active
    assert segment_names(cfg.commitlog_dir)[0] == units.offset_to_file_name(f.active)
    states = manifest_states(root)
    assert {b: states[b] for b in f.bases} == {**{b: "deleted" for b in f.sealed}, f.active: "active"}
    f.assert_reads(f.active)


@pytest.mark.integration
def test_mark_by_non_owner_raises_naming_the_manifest(filled, claimers):
    f = filled(segments=2)
    root = f.cfg.store_path_root_dir
    f.store.clean_expired_files()
    holder = claimers(root, "holder")
    holder.call("claim", limit=1)
    m = SegmentManifest(root)
    intruder = claimer_id("intruder")
    for call in (
        lambda: m.mark_tiered(f.sealed[0], intruder),
        lambda: m.mark_quarantined(f.sealed[0], intruder, "no"),
        lambda: m.release(f.sealed[0], intruder),
        lambda: m.mark_tiered(f.sealed[1], intruder),  # expired, claimed by nobody
        lambda: m.mark_tiered(123, intruder),  # no such segment
    ):
        with pytest.raises(ManifestError) as e:
            call()
        assert str(m.path) in str(e.value)
    assert m.get(f.sealed[0]).state == SegmentState.TIERING and m.get(f.sealed[0]).claimed_by == holder.owner
    assert m.get(f.sealed[1]).state == SegmentState.EXPIRED
    holder.call("mark_tiered", f.sealed[0])
    assert m.get(f.sealed[0]).state == SegmentState.TIERED


@pytest.mark.unit
def test_manifest_records_what_each_sealed_segment_holds(filled):
    f = filled(segments=4, file_reserved_time=72)
    cfg, root = f.cfg, f.cfg.store_path_root_dir

    def scan(base: int) -> tuple[int, int, int]:
        data = (cfg.commitlog_dir / units.offset_to_file_name(base)).read_bytes()
        pos, times = 0, []
        while True:
            res = records.check_record(data, pos)
            if res.blank or not res.ok or res.size <= 0:
                break
            times.append(res.request.store_timestamp)
            pos += res.size
        assert res.blank, f"segment {base} must end with a blank record"
        return len(times), times[0], times[-1]

    def recorded() -> dict[int, tuple]:
        return {e.base_offset: (e.message_count, e.first_store_time, e.last_store_time)
                for e in SegmentManifest(root).entries()}  # fmt: skip

    f.store.clean_expired_files()
    expected = {b: scan(b) for b in f.sealed}
    assert sum(n for n, _, _ in expected.values()) == sum(1 for _q, _o, phy, _s, _b in f.puts if phy < f.active)
    got = recorded()
    assert {b: got[b] for b in f.sealed} == expected
    assert got[f.active] == (None, None, None), "the active segment has no final figures yet"
    # the figures survive restarts
    f.store.shutdown()
    f.store = MessageStore(cfg).start()
    got = recorded()
    assert {b: got[b] for b in f.sealed} == expected
    # and the segment that was active across the restart gets its own once it is sealed
    i = 0
    while len(f.store.commitlog.queue.files) == len(f.bases):
        assert f.store.put_message(make_message(TOPIC, i % QUEUES, b"after restart %d" % i)).ok
        i += 1
    wait_dispatched(f.store)
    f.store.clean_expired_files()
    assert recorded()[f.active] == scan(f.active)


@pytest.mark.unit
def test_released_claim_on_an_unexpired_segment_is_not_deleted_early(filled):
    """A job that claimed sealed segments early (treat_sealed_as_expired) and gave them back must not make
    them deletable before fileReservedTime, even under the classic delete policy."""
    f = filled(segments=2, file_reserved_time=72, expired_segment_policy="delete")
    root = f.cfg.store_path_root_dir
    f.store.clean_expired_files()
    m = SegmentManifest(root)
    owner = claimer_id("early")
    assert [e.base_offset for e in m.claim(owner, treat_sealed_as_expired=True)] == f.sealed
    for base in f.sealed:
        assert m.release(base, owner).state == SegmentState.SEALED
    f.store.delete_expired_files_manually()
    assert segment_names(f.cfg.commitlog_dir)[: len(f.sealed)] == [units.offset_to_file_name(b) for b in f.sealed]
    assert {b: manifest_states(root)[b] for b in f.sealed} == {b: "sealed" for b in f.sealed}
    f.assert_reads(0)


# ---------------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_disk_used_ratio_is_rocketmqs_rounded_up_percent(tmp_path, monkeypatch):
    # UtilAll.getDiskPartitionSpaceUsedPercent: used = total - free, over used + usable (root's reserve counts
    # as neither), rounded up to a whole percent. 1000 blocks, 400 free, 350 usable: 600 / 950 = 63.2 % -> 0.64
    for (bfree, bavail), want in (((400, 350), 0.64), ((500, 500), 0.50), ((1000, 950), 0.0)):
        fake = os.statvfs_result((4096, 4096, 1000, bfree, bavail, 0, 0, 0, 0, 255))
        monkeypatch.setattr(os, "statvfs", lambda _p, fake=fake: fake)
        assert disk_used_ratio(tmp_path) == want
    monkeypatch.undo()
    assert 0.0 <= disk_used_ratio(tmp_path) <= 1.0  # the real disk, whatever it holds
    assert disk_used_ratio(tmp_path / "missing") == -1.0


@pytest.mark.unit
def test_disk_thresholds_are_clamped_as_rocketmq_5_clamps_them(tmp_path):
    cfg = make_config(tmp_path, diskSpaceWarningLevelRatio=99, diskSpaceCleanForciblyRatio=10)
    assert (cfg.disk_space_warning_level_ratio, cfg.disk_space_clean_forcibly_ratio) == (90, 30)
    cfg = make_config(tmp_path, diskSpaceWarningLevelRatio=20, diskSpaceCleanForciblyRatio=99)
    assert (cfg.disk_space_warning_level_ratio, cfg.disk_space_clean_forcibly_ratio) == (35, 85)


@pytest.mark.expected_errors("disk maybe full soon")
@pytest.mark.unit
def test_a_full_disk_refuses_puts_and_keeps_what_was_acknowledged(filled, monkeypatch):
    # No test can fill the machine's disk: the measurement is replaced, the refusal and the retention are real.
    used = {"ratio": 0.50}
    monkeypatch.setattr("store.message_store.disk_used_ratio", lambda _path: used["ratio"])
    f = filled(segments=2, file_reserved_time=72, clean_file_forcibly_enable=True)
    root, s = f.cfg.store_path_root_dir, f.store
    files_before = segment_names(f.cfg.commitlog_dir)
    assert s.clean_expired_files() == []
    assert {b: manifest_states(root)[b] for b in f.sealed} == {b: "sealed" for b in f.sealed}, "not due yet"

    used["ratio"] = 0.86  # over diskSpaceCleanForciblyRatio (85): every sealed segment is due, whatever its age
    assert s.clean_expired_files() == []
    assert {b: manifest_states(root)[b] for b in f.sealed} == {b: "expired" for b in f.sealed}
    res = s.put_message(make_message(TOPIC, 0, b"still accepted"))
    assert res.ok
    f.puts.append((0, res.append.queue_offset, res.append.wrote_offset, res.append.wrote_bytes, b"still accepted"))
    wait_dispatched(s)

    used["ratio"] = 0.91  # over diskSpaceWarningLevelRatio (90)
    assert s.clean_expired_files() == []
    for res in (s.put_message(make_message(TOPIC, 0, b"refused")),
                s.put_message([make_message(TOPIC, 1, b"b1"), make_message(TOPIC, 1, b"b2")])):  # fmt: skip
        assert res.status == PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "the broker's disk is full [CL:  0.91 CQ:  0.91 INDEX:  0.91]" in res.error  # RocketMQ's remark
    assert s.runtime_info()["commitLogDiskRatio"] == "0.91"
    # under the tier policy no segment leaves the disk untiered, however full it is
    assert set(files_before) <= set(segment_names(f.cfg.commitlog_dir))
    f.assert_reads(0)
    for q in (0, 1):  # nothing refused got in
        assert s.get_max_offset_in_queue(TOPIC, q) == 1 + max(off for qq, off, *_ in f.puts if qq == q)

    used["ratio"] = 0.89
    s.clean_expired_files()
    assert s.put_message(make_message(TOPIC, 0, b"accepted again")).ok

    # a store started on a full disk refuses from its first put
    used["ratio"] = 0.95
    s.shutdown()
    f.store = MessageStore(f.cfg).start()
    assert f.store.put_message(make_message(TOPIC, 0, b"x")).status == PutMessageStatus.SERVICE_NOT_AVAILABLE
