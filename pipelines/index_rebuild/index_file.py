"""IndexFiles rebuilt from the dispatch table, exactly as ``store.index.IndexService`` writes them, and
compared with the live files through their hash chains.

The store puts the keys of each record in CommitLog order into the last file, rolling to a new one
when it holds ``maxIndexNum - 1`` entries; a new file's header starts as a copy of the previous one's
end, so the first entry's time difference counts from the previous file's last store time.  The
simulation below reproduces that with numpy, one file at a time: entry n's ``prev`` is the previous
entry of the same slot in the same file, a slot holds its newest entry, ``hashSlotCount`` counts
entries that found their slot empty.

On a tiered store the first live file may hold entries for CommitLog data that is gone; those
entries are carried over from the live file unjudged (they cannot be rebuilt) and the rebuild
continues after them, so chains and time differences still line up with what the store wrote.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.index_rebuild.live import LiveIndexFile
from store.format import units

MAX_PROBLEMS = 20
# Which keys a broker indexes (``store.format.records.index_keys``): RocketMQ 4.x's rule (and the store's) puts
# the UNIQ_KEY and each KEYS entry; 5.x's also puts the tag. A store's files follow one of them.
RULE_4, RULE_5 = "4.x", "5.x"
RULES = (RULE_4, RULE_5)
_MAX_TDIFF = 0x7FFFFFFF


@dataclass
class IndexEntries:
    """Every index entry the dispatch of the scanned records makes, in put order."""

    hashes: np.ndarray  # int64, non-negative (Math.abs of the Java hash)
    phy: np.ndarray  # int64
    ts: np.ndarray  # int64 store timestamps
    record: np.ndarray  # row of the dispatch table each entry came from
    key_pos: np.ndarray  # which of its record's index keys the entry is
    topics: pa.Array  # per dispatch-table row
    store_dir: Path | None = None  # where to re-read a key's text (only the hashes cross the wire)

    def __len__(self) -> int:
        return len(self.hashes)

    def take(self, idx: np.ndarray) -> IndexEntries:
        return IndexEntries(self.hashes[idx], self.phy[idx], self.ts[idx], self.record[idx], self.key_pos[idx],
                            self.topics, self.store_dir)  # fmt: skip

    def name(self, i: int) -> tuple[str, str | None]:
        """(topic, key) of entry ``i``, the key read back from its CommitLog record (for a report)."""
        from pipelines.index_rebuild.scan import index_key_at

        topic = self.topics[int(self.record[i])].as_py()
        key = index_key_at(self.store_dir, int(self.phy[i]), int(self.key_pos[i])) if self.store_dir else None
        return topic, key


def has_tag_keys(table: pa.Table) -> bool:
    """Do the two rules differ for these records (does any carry a tag key)?"""
    return bool(table.num_rows) and bool(pc.any(table.column("tag_key")).as_py())


def index_entries(table: pa.Table, store_dir: Path | None = None, rule: str = RULE_4) -> IndexEntries:
    """The entries of the scanned records by ``rule``: RocketMQ 5.x's keeps each record's tag key (its last),
    4.x's drops it."""
    hashes = table.column("index_hashes").combine_chunks()
    parent = pc.list_parent_indices(hashes).to_numpy()
    offsets = hashes.offsets.to_numpy()
    key_pos = np.arange(len(parent)) - offsets[parent] + offsets[0]
    ent = IndexEntries(
        hashes=pc.list_flatten(hashes).to_numpy().astype(np.int64),
        phy=table.column("commitlog_offset").to_numpy()[parent],
        ts=table.column("store_timestamp").to_numpy()[parent],
        record=parent,
        key_pos=key_pos,
        topics=table.column("topic").combine_chunks(),
        store_dir=store_dir,
    )
    if rule == RULE_5:
        return ent
    lengths = np.diff(offsets)
    tag = table.column("tag_key").combine_chunks().to_numpy(zero_copy_only=False)
    return ent.take(np.flatnonzero(~(tag[parent] & (key_pos == lengths[parent] - 1))))


def reindexed_records(ent: IndexEntries, live: list[LiveIndexFile], cl_min: int) -> dict[int, int]:
    """Records the live files index more than once: CommitLog offset -> extra times.

    After a restart the store re-dispatches from the highest ConsumeQueue offset, and ``build_index``
    skips only records *below* the last file's ``endPhyOffset`` — so a log ending in records without a
    queue unit (transaction halves) gets its last indexed record indexed again, all of its keys (RocketMQ
    does the same).  The rebuild repeats those records where the store did, so later entries, chains and
    file roll-overs still line up; the report lists them.
    """
    if not live or not len(ent):
        return {}
    parts = [lf.entries[1 : lf.count] for lf in live]
    allent = np.concatenate(parts) if parts else np.zeros(0, units.INDEX_ENTRY_DTYPE)
    allent = allent[allent["phy"] >= cl_min]
    if not len(allent):
        return {}
    h, phy = allent["hash"].astype(np.int64), allent["phy"].astype(np.int64)
    order = np.lexsort((h, phy))
    h, phy = h[order], phy[order]
    again = np.flatnonzero((h[1:] == h[:-1]) & (phy[1:] == phy[:-1])) + 1
    extra_by_phy: dict[int, int] = {}
    if not len(again):
        return extra_by_phy
    per_key: dict[tuple[int, int], int] = {}
    for k in zip(h[again].tolist(), phy[again].tolist(), strict=True):
        per_key[k] = per_key.get(k, 0) + 1
    for (kh, p), c in per_key.items():
        lo, hi = np.searchsorted(ent.phy, p, "left"), np.searchsorted(ent.phy, p, "right")
        once = int((ent.hashes[lo:hi] == kh).sum())  # a record may name one key twice: that is no re-put
        if once and (c + 1) // once > 1:
            extra_by_phy[p] = max(extra_by_phy.get(p, 0), (c + 1) // once - 1)
    return extra_by_phy


def repeat_records(ent: IndexEntries, extra_by_phy: dict[int, int]) -> IndexEntries:
    """``ent`` with each record in ``extra_by_phy`` followed by that many more copies of its keys."""
    if not extra_by_phy:
        return ent
    pieces = []
    pos = 0
    for phy in sorted(extra_by_phy):
        lo, hi = np.searchsorted(ent.phy, phy, "left"), np.searchsorted(ent.phy, phy, "right")
        if lo == hi:
            continue
        pieces.append(np.arange(pos, hi))
        pieces.extend([np.arange(lo, hi)] * extra_by_phy[phy])
        pos = hi
    pieces.append(np.arange(pos, len(ent)))
    return ent.take(np.concatenate(pieces))


@dataclass
class RebuiltIndexFile:
    header: units.IndexHeader
    slots: np.ndarray  # int32 per slot (native order)
    entries: np.ndarray  # units.INDEX_ENTRY_DTYPE, entries 0..index_count-1
    first_new: int  # entry number of the first rebuilt (not carried) entry
    entry_index: np.ndarray  # for entries first_new.., their position in IndexEntries
    carried_from: str | None = None  # the live file the carried entries came from

    @property
    def count(self) -> int:
        return self.header.index_count

    def header_bytes(self) -> bytes:
        return units.encode_index_header(self.header)


def _tdiff(ts: np.ndarray, begin: int) -> np.ndarray:
    if begin <= 0:
        return np.zeros(len(ts), np.int64)
    return np.clip((ts - begin) // 1000, 0, _MAX_TDIFF)


def _put_run(f: RebuiltIndexFile, ent: IndexEntries, lo: int, hi: int, slot_num: int) -> None:
    """Put entries ``lo..hi`` of ``ent`` into ``f`` (which has room for them), as ``IndexFile.put_key`` does."""
    n = hi - lo
    h = f.header
    start = h.index_count
    e = np.arange(start, start + n, dtype=np.int64)
    hashes, phy, ts = ent.hashes[lo:hi], ent.phy[lo:hi], ent.ts[lo:hi]
    slot = hashes % slot_num
    tdiff = np.empty(n, np.int64)
    if start <= 1:
        tdiff[0] = _tdiff(ts[:1], h.begin_timestamp)[0]  # the header still holds the previous file's end
        h.begin_phy_offset, h.begin_timestamp = int(phy[0]), int(ts[0])
        tdiff[1:] = _tdiff(ts[1:], h.begin_timestamp)
    else:
        tdiff[:] = _tdiff(ts, h.begin_timestamp)
    order = np.lexsort((e, slot))
    s_sorted, e_sorted = slot[order], e[order]
    new_group = np.r_[True, s_sorted[1:] != s_sorted[:-1]]
    prev_sorted = np.r_[0, e_sorted[:-1]]
    prev_sorted[new_group] = f.slots[s_sorted[new_group]]
    prev = np.empty(n, np.int64)
    prev[order] = prev_sorted
    last_of_group = np.r_[new_group[1:], True]
    f.slots[s_sorted[last_of_group]] = e_sorted[last_of_group]
    entries = np.zeros(start + n, units.INDEX_ENTRY_DTYPE)
    entries[:start] = f.entries[:start]
    entries["hash"][start:], entries["phy"][start:] = hashes, phy
    entries["tdiff"][start:], entries["prev"][start:] = tdiff, prev
    f.entries = entries
    f.entry_index = np.r_[f.entry_index, np.arange(lo, hi)]
    h.hash_slot_count += int((prev == 0).sum())
    h.index_count = start + n
    h.end_phy_offset, h.end_timestamp = int(phy[-1]), int(ts[-1])


def _carry(live: LiveIndexFile, cl_min: int, slot_num: int) -> RebuiltIndexFile | None:
    """The entries of a live file that point below the CommitLog minimum, kept as the store has them."""
    count = live.count
    below = np.flatnonzero(live.entries["phy"][1:count] >= cl_min)
    keep = int(below[0]) + 1 if len(below) else count  # entries 1..keep-1 are carried
    if keep <= 1:
        return None
    entries = np.array(live.entries[:keep])
    slots = np.zeros(slot_num, np.int64)
    slot = entries["hash"][1:].astype(np.int64) % slot_num
    slots[slot] = np.arange(1, keep)  # later entries overwrite earlier ones: the newest per slot
    # The end fields are the live ones; if the rebuild continues in this file, its puts overwrite them.
    h = units.IndexHeader(live.header.begin_timestamp, live.header.end_timestamp, live.header.begin_phy_offset,
                        int(entries["phy"][-1]), len(np.unique(slot)), keep)  # fmt: skip
    return RebuiltIndexFile(h, slots, entries, keep, np.zeros(0, np.int64), carried_from=live.name)


def rebuild_index(
    ent: IndexEntries, slot_num: int, index_num: int, *, live: list[LiveIndexFile], cl_min: int
) -> list[RebuiltIndexFile]:
    """The files ``IndexService`` holds after dispatching ``ent`` in order (continuing carried live entries)."""
    files: list[RebuiltIndexFile] = []
    if cl_min > 0:
        for lf in live:  # files wholly below the minimum were deleted with the data; the first one left may not be
            carried = _carry(lf, cl_min, slot_num)
            if carried is None:
                break
            files.append(carried)
            if carried.count < lf.count:
                break
    pos, n = 0, len(ent)
    while pos < n:
        last = files[-1] if files else None
        if last is None or last.count >= index_num:
            h = units.IndexHeader()
            if last is None and cl_min > 0 and live and n:
                # The first file left after tiering was rolled from a deleted one: its first entry's time
                # difference counts from that file's end, which is gone. Take it from the live entry when
                # that entry is the same key and offset (it cannot be judged either way).
                le = live[0].entry(1)
                if le is not None and (le[0], le[1]) == (int(ent.hashes[0]), int(ent.phy[0])) and le[2] > 0:
                    h.begin_timestamp = int(ent.ts[0]) - le[2] * 1000
            if last is not None:  # IndexService._writable_file: a new file starts where the last one ended
                h.begin_phy_offset = h.end_phy_offset = last.header.end_phy_offset
                h.begin_timestamp = h.end_timestamp = last.header.end_timestamp
            last = RebuiltIndexFile(h, np.zeros(slot_num, np.int64), np.zeros(1, units.INDEX_ENTRY_DTYPE), 1,
                                    np.zeros(0, np.int64))  # fmt: skip
            files.append(last)
        take = min(n - pos, index_num - last.count)
        _put_run(last, ent, pos, pos + take, slot_num)
        pos += take
    return files


# =====================================================================================================
# comparison
# =====================================================================================================


def _header_position(name: str) -> int:
    """Byte position of an IndexFile header field."""
    return units.INDEX_HEADER_DTYPE.fields[name][1]


@dataclass
class IndexResult:
    file: str | None  # the live file's name (None: no live file for this part of the rebuild)
    path: str | None
    status: str = "ok"  # ok | mismatch | missing | extra
    rebuilt_file: str | None = None  # the name a repair gives the rebuilt file
    begin_phy_offset: int | None = None  # of the rebuilt file: which CommitLog range it covers
    end_phy_offset: int | None = None
    entries: int = 0  # rebuilt entries judged
    carried: int = 0  # live entries below the CommitLog minimum, not judged
    matched: int = 0
    missing: int = 0  # not in the live file at all
    mismatched: int = 0  # the live entry at that number differs
    unreachable: int = 0  # present, but the live slot / chain does not lead to it
    extra: int = 0  # reachable live entries the rebuild does not have
    not_judged: int = 0  # live entries past the dispatched bound of a running broker
    identical: bool = False  # header, slots and entries byte for byte
    header: dict = field(default_factory=dict)  # field -> {"live": x, "rebuilt": y}, mismatches only
    problems: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def match_files(rebuilt: list[RebuiltIndexFile], live: list[LiveIndexFile]) -> list[tuple]:
    """Pair rebuilt and live files: by the CommitLog offset they begin at, then leftovers in order."""
    by_begin = {}
    for lf in live:
        by_begin.setdefault(lf.header.begin_phy_offset, lf)
    pairs: list[list] = []
    used = set()
    for rf in rebuilt:
        lf = by_begin.get(rf.header.begin_phy_offset)
        if rf.carried_from is not None:
            lf = next((x for x in live if x.name == rf.carried_from), lf)
        if lf is not None and lf.name not in used:
            used.add(lf.name)
            pairs.append([rf, lf])
        else:
            pairs.append([rf, None])
    spare = [lf for lf in live if lf.name not in used]
    # A file whose header was damaged does not match by offset: pair it with the rebuilt file in its place
    # (between the live files matched to the rebuilt files before and after it).
    for i, pair in enumerate(pairs):
        if pair[1] is None and spare:
            lo = max((p[1].name for p in pairs[:i] if p[1] is not None), default="")
            hi = min((p[1].name for p in pairs[i + 1 :] if p[1] is not None), default="~")
            cand = [lf for lf in spare if lo < lf.name < hi]
            if cand:
                pair[1] = cand[0]
                spare.remove(cand[0])
    return [(rf, lf) for rf, lf in pairs] + [(None, lf) for lf in spare]


def entries_apart(rf: RebuiltIndexFile | None, lf: LiveIndexFile | None) -> int:
    """Entries (by number) that differ between a rebuilt file and its live counterpart, carried ones aside:
    how far a rule is from what the store wrote. Damaged slots or links leave it 0 under the right rule, while
    the wrong rule puts different keys at nearly every number."""
    if rf is None or lf is None:
        return (lf.count - 1) if lf is not None else (rf.count - rf.first_new if rf is not None else 0)
    n = min(rf.count, lf.count)
    differ = int((rf.entries[rf.first_new : n] != lf.entries[rf.first_new : n]).sum()) if n > rf.first_new else 0
    return differ + abs(rf.count - lf.count)


def _entry_dict(e) -> dict:
    return {"hash": int(e[0]), "commitlog_offset": int(e[1]), "time_diff": int(e[2]), "prev": int(e[3])}


def compare_file(
    rf: RebuiltIndexFile | None, lf: LiveIndexFile | None, ent: IndexEntries, slot_num: int, *, bound: int | None,
    last: bool,
) -> IndexResult:  # fmt: skip
    """Judge one live file against its rebuilt counterpart; ``last``: the rebuild's last file, which a running
    broker's live counterpart may have grown past (``bound`` is set when a broker runs)."""
    res = IndexResult(lf.name if lf else None, str(lf.path) if lf else None)
    if rf is not None:
        res.begin_phy_offset, res.end_phy_offset = rf.header.begin_phy_offset, rf.header.end_phy_offset
        res.carried = rf.first_new - 1
        res.entries = rf.count - rf.first_new
    if lf is None:
        res.status = "missing"
        res.missing = res.entries
        if res.entries:
            t, k = ent.name(int(rf.entry_index[0]))
            res.problems.append({"kind": "missing_file", "file": None, "topic": t, "key": k,
                                 "commitlog_offset": rf.header.begin_phy_offset,
                                 "detail": f"no live IndexFile holds the {res.entries} entries for CommitLog offsets "
                                           f"{rf.header.begin_phy_offset}..{rf.header.end_phy_offset}"})  # fmt: skip
        return res
    if lf.size != lf.expected_size:
        res.problems.append({"kind": "file_size", "file": str(lf.path), "position": 0,
                             "detail": f"size {lf.size}, maxHashSlotNum/maxIndexNum give {lf.expected_size}"})
    if rf is None:
        live_entries = lf.entries[1 : lf.count]
        judged = live_entries["phy"] < bound if bound is not None else np.ones(len(live_entries), bool)
        res.extra = int(judged.sum())
        res.not_judged = len(live_entries) - res.extra
        res.status = "extra" if res.extra or res.problems else "ok"
        if res.extra:
            res.problems.append({"kind": "extra_file", "file": str(lf.path), "position": 0,
                                 "detail": f"{res.extra} entries the CommitLog does not produce "
                                           f"(offsets {lf.header.begin_phy_offset}..{lf.header.end_phy_offset})"})
        return res
    running_last = bound is not None and last
    lh = lf.header
    for name, _ in units.INDEX_HEADER_FIELDS:
        if running_last and name not in ("begin_timestamp", "begin_phy_offset"):
            continue  # the broker keeps appending to this file
        lv, rv = getattr(lh, name), getattr(rf.header, name)
        if lv != rv:
            res.header[name] = {"live": lv, "rebuilt": rv}
    for name, d in res.header.items():
        res.problems.append({"kind": "header", "file": str(lf.path), "position": _header_position(name),
                             "field": name, "expected": d["rebuilt"], "actual": d["live"]})  # fmt: skip
    n = rf.count
    live_n = min(len(lf.entries), n)
    same_entries = live_n == n and bool((lf.entries[rf.first_new:n] == rf.entries[rf.first_new:n]).all())
    same_slots = len(lf.slots) == slot_num and bool((lf.slots.astype(np.int64) == rf.slots).all())
    res.identical = same_entries and same_slots and not res.header and lh.index_count == n
    if res.identical or (running_last and same_entries and lh.index_count >= n):
        # Same bytes: every chain reaches what it should. (A running broker's last file only grew.)
        res.matched = res.entries
        res.status = "ok" if not res.problems else "mismatch"
        if running_last:
            res.not_judged = max(0, lh.index_count - n)
        return res
    _walk_compare(res, rf, lf, ent, slot_num, bound)
    if not res.problems and not running_last:
        res.problems.append(_first_byte_difference(rf, lf, slot_num))
    res.status = "mismatch" if res.problems else "ok"
    return res


def _first_byte_difference(rf: RebuiltIndexFile, lf: LiveIndexFile, slot_num: int) -> dict:
    """Every chain checks out, yet the bytes differ (a slot no key uses, an entry past the count): where."""
    d = {"kind": "bytes", "file": str(lf.path)}
    if len(lf.slots) == slot_num:
        diff = np.flatnonzero(lf.slots.astype(np.int64) != rf.slots)
        if len(diff):
            s = int(diff[0])
            return d | {"slot": s, "position": units.index_slot_position(s), "expected": int(rf.slots[s]),
                        "actual": lf.slot(s)}  # fmt: skip
    n = min(rf.count, len(lf.entries))
    diff = np.flatnonzero(lf.entries[rf.first_new : n] != rf.entries[rf.first_new : n])
    e = int(diff[0]) + rf.first_new if len(diff) else n
    return d | {"entry": e, "position": units.index_entry_position(slot_num, e)}


def _walk_compare(
    res: IndexResult, rf: RebuiltIndexFile, lf: LiveIndexFile, ent: IndexEntries, slot_num: int, bound: int | None
) -> None:
    """Per rebuilt entry: is it reachable from its slot in the live file? And what does the live file reach
    that the rebuild does not have?"""
    new = rf.entries[rf.first_new : rf.count]
    slots = (new["hash"].astype(np.int64) % slot_num) if len(new) else np.zeros(0, np.int64)
    reached: set[tuple[int, int, int]] = set()
    reached_at: dict[tuple[int, int, int], int] = {}
    for s in np.unique(slots).tolist():
        for e in lf.chain(s):
            le = lf.entry(e)
            if le[0] % slot_num == s and le[0] >= 0:
                t = (le[0], le[1], le[2])
                reached.add(t)
                reached_at.setdefault(t, e)
    expected = set()
    problems: list[dict] = []
    for i in range(len(new)):
        e = rf.first_new + i
        r = new[i]
        t = (int(r["hash"]), int(r["phy"]), int(r["tdiff"]))
        expected.add(t)
        if t in reached:
            res.matched += 1
            continue
        le = lf.entry(e) if e < lf.count else None
        kind = "missing" if le is None else "mismatched" if le[:3] != t else "unreachable"
        setattr(res, kind, getattr(res, kind) + 1)
        if len(problems) >= MAX_PROBLEMS:
            continue  # counted; only the listed ones read their key back from the CommitLog
        topic, key = ent.name(int(rf.entry_index[i]))
        s = int(slots[i])
        p = {"kind": kind, "file": str(lf.path), "entry": e, "slot": s, "topic": topic, "key": key,
             "commitlog_offset": t[1], "position": units.index_entry_position(slot_num, e),
             "expected": _entry_dict(r.tolist())}  # fmt: skip
        if kind == "mismatched":
            p["actual"] = _entry_dict(le)
        elif kind == "unreachable":
            p["reason"] = _why_unreachable(rf, lf, s, slot_num)
        problems.append(p)
    for t in reached - expected:
        if bound is not None and t[1] >= bound:
            res.not_judged += 1
            continue
        res.extra += 1
        if len(problems) < MAX_PROBLEMS:
            e = reached_at[t]
            problems.append({"kind": "extra", "file": str(lf.path), "entry": e, "commitlog_offset": t[1],
                             "position": units.index_entry_position(slot_num, e), "actual": _entry_dict(lf.entry(e))})
    res.problems.extend(problems)


def _why_unreachable(rf: RebuiltIndexFile, lf: LiveIndexFile, s: int, slot_num: int) -> str:
    """Where the live chain of slot ``s`` departs from the rebuilt one: the slot itself or an entry's link."""
    want = int(rf.slots[s])
    have = lf.slot(s)
    if have != want:
        return f"slot {s} (byte {units.index_slot_position(s)}) holds entry {have}, expected {want}"
    e = want
    while e > 0:
        live_e = lf.entry(e)
        want_prev = int(rf.entries[e]["prev"])
        if live_e is None or live_e[3] != want_prev:
            got = None if live_e is None else live_e[3]
            pos = units.index_entry_position(slot_num, e) + 16
            return f"chain broken at entry {e} (byte {pos}): prev is {got}, expected {want_prev}"
        e = want_prev
    return f"slot {s}: the live chain does not reach it (header indexCount {lf.header.index_count})"


def write_index_file(path: Path, rf: RebuiltIndexFile, slot_num: int, index_num: int) -> None:
    """Write a rebuilt file at its full (sparse) size, as ``IndexFile`` creates it."""
    size = units.index_file_size(slot_num, index_num)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.truncate(size)
        fh.write(rf.header_bytes())
        fh.write(rf.slots.astype(units.INDEX_SLOT_DTYPE).tobytes())
        fh.seek(units.index_entry_position(slot_num, 1))
        fh.write(rf.entries[1:].tobytes())
        os.fsync(fh.fileno())
    os.replace(tmp, path)
