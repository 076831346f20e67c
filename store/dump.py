"""What ``mqlake store dump`` prints (cli/store.py), as data: a store's records, ConsumeQueue units and IndexFile
headers, and the problems ``--verify`` finds, each naming file and position.  An entry of the store dir that is not
what its place holds (a badly named file or directory) is skipped and reported, never a crash.

Safe on the store of a running broker: files are mapped read-only and no lock is taken.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from store.format import hashing, records, units


@dataclass(slots=True)
class Problem:
    file: str
    position: int
    offset: int
    kind: str
    detail: str

    def __str__(self) -> str:
        if self.kind == "name":  # a whole entry: no position in it
            return f"{self.file}: {self.detail}"
        return f"{self.file} @ {self.position} (offset {self.offset}): {self.kind}: {self.detail}"


def _odd(path: Path, detail: str) -> Problem:
    """An entry of the store dir that is not what its place holds: skipped, and reported."""
    return Problem(str(path), 0, 0, "name", detail)


def _segments(directory: Path, odd: list[Problem] | None = None) -> list[Path]:
    """The segment files of ``directory`` by name; anything else there is appended to ``odd``."""
    if not directory.is_dir():
        return []
    out = []
    for p in directory.iterdir():
        if p.is_file() and units.is_offset_file_name(p.name):
            out.append(p)
        elif odd is not None and not p.name.endswith(".tmp"):  # a .tmp is an interrupted preallocation
            odd.append(_odd(p, "not a segment (name must be a 20-digit start offset)"))
    return sorted(out)


def _map(path: Path) -> mmap.mmap | None:
    if path.stat().st_size == 0:
        return None
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def commitlog_dir(store_dir: Path) -> Path:
    return store_dir / "commitlog" if (store_dir / "commitlog").is_dir() else store_dir


def iter_records(store_dir: Path, check_crc: bool = True, odd: list[Problem] | None = None) -> Iterator[dict | Problem]:
    """Every record of every CommitLog segment as a dict, and every problem found on the way; entries of the
    commitlog directory that are not segments are appended to ``odd``."""
    for path in _segments(commitlog_dir(store_dir), odd):
        base = int(path.name)
        mm = _map(path)
        if mm is None:
            yield Problem(str(path), 0, base, "empty", "zero-length segment")
            continue
        try:
            yield from _iter_segment(path, base, mm, check_crc)
        finally:
            mm.close()


def _iter_segment(path: Path, base: int, mm: mmap.mmap, check_crc: bool) -> Iterator[dict | Problem]:
    size = len(mm)
    walk = records.RecordWalk(mm)
    for pos, total in walk:
        try:
            rec = records.decode_record(mm, pos, check_crc=False, source=str(path), size=total)
        except records.RecordError as e:
            yield Problem(str(path), pos, base + pos, "record", e.reason)
            return
        crc_ok = hashing.body_crc32(rec.body) == rec.body_crc
        if check_crc and rec.body and not crc_ok:
            detail = f"stored {rec.body_crc}, computed {hashing.body_crc32(rec.body)}"
            yield Problem(str(path), pos, base + pos, "crc", detail)
        if rec.physical_offset != base + pos:
            yield Problem(
                str(path), pos, base + pos, "offset", f"PHYSICALOFFSET field {rec.physical_offset} != {base + pos}"
            )
        yield {
            "offset": base + pos,
            "file": path.name,
            "position": pos,
            "topic": rec.topic,
            "queue_id": rec.queue_id,
            "queue_offset": rec.queue_offset,
            "size": rec.total_size,
            "store_timestamp": rec.store_timestamp,
            "keys": rec.keys,
            "tags": rec.tags,
            "uniq_key": rec.uniq_key,
            "sys_flag": rec.sys_flag,
            "crc_ok": crc_ok,
        }
    pos = walk.end
    if walk.ended is records.WalkEnd.BLANK:
        if pos + walk.blank_size != size:
            detail = f"BLANK of {walk.blank_size} bytes does not reach the end"
            yield Problem(str(path), pos, base + pos, "blank", detail)
    elif walk.ended is records.WalkEnd.ZEROS:
        if any(mm[pos : min(size, pos + 4096)]):  # the active tail is zeros from here on
            yield Problem(str(path), pos, base + pos, "torn-tail", "non-zero bytes after the last record")
    elif walk.ended is records.WalkEnd.INVALID:
        yield Problem(str(path), pos, base + pos, "record", walk.reason)


def queue_dirs(root: Path, odd: list[Problem] | None = None) -> Iterator[tuple[Path, Path]]:
    """(topic dir, queue dir) of every ``consumequeue/{topic}/{queueId}``, by topic and queue id; any other entry
    is appended to ``odd``."""
    if not root.is_dir():
        return
    for topic_dir in sorted(root.iterdir()):
        if not topic_dir.is_dir():
            if odd is not None:
                odd.append(_odd(topic_dir, "not a topic directory"))
            continue
        qdirs = []
        for p in topic_dir.iterdir():
            if p.is_dir() and p.name.isascii() and p.name.isdigit():
                qdirs.append(p)
            elif odd is not None:
                odd.append(_odd(p, "not a queue directory (name must be a queue id)"))
        for qdir in sorted(qdirs, key=lambda p: int(p.name)):
            yield topic_dir, qdir


def iter_cq_units(store_dir: Path, odd: list[Problem] | None = None) -> Iterator[dict]:
    """Every unit of every ConsumeQueue; entries of ``consumequeue/`` that are not queues or segments are skipped
    and appended to ``odd``."""
    for topic_dir, qdir in queue_dirs(store_dir / "consumequeue", odd):
        for path in _segments(qdir, odd):
            mm = _map(path)
            if mm is None:
                continue
            with mm:
                base = int(path.name) // units.CQ_UNIT_SIZE
                whole = len(mm) - len(mm) % units.CQ_UNIT_SIZE
                for i, (phy, size, tags) in enumerate(units.iter_cq_units(mm[:whole])):
                    if size <= 0 and phy == 0:
                        break
                    yield {
                        "topic": topic_dir.name,
                        "queue_id": int(qdir.name),
                        "queue_offset": base + i,
                        "commitlog_offset": phy,
                        "size": size,
                        "tags_code": tags,
                        "file": str(path),
                    }


def iter_index_headers(store_dir: Path, odd: list[Problem] | None = None) -> Iterator[dict]:
    """The header of every IndexFile; other entries of ``index/``, and files too short for a header, are skipped
    and appended to ``odd``."""
    root = store_dir / "index"
    if not root.is_dir():
        return
    for path in sorted(root.iterdir()):
        if not (path.is_file() and units.is_index_file_name(path.name)):
            if odd is not None and not path.name.endswith(".tmp"):
                odd.append(_odd(path, "not an IndexFile (name must be its creation time, yyyyMMddHHmmssSSS)"))
            continue
        with open(path, "rb") as f:
            head = f.read(units.INDEX_HEADER_SIZE)
        if len(head) < units.INDEX_HEADER_SIZE:
            if odd is not None:
                odd.append(Problem(str(path), len(head), 0, "index", f"{len(head)} bytes, shorter than its header"))
            continue
        h = units.decode_index_header(head)
        yield {"file": path.name, "size": path.stat().st_size, **{k: getattr(h, k) for k in h.__slots__}}


def verify_consume_queues(
    store_dir: Path, by_offset: dict[int, dict], unreadable: list[Problem], odd: list[Problem] | None = None
) -> Iterator[Problem]:
    """Each unit must point at a record of its topic and queue, with its queue offset and size.

    Units pointing past a CommitLog problem (where the scan had to stop) are counted per queue rather
    than reported one by one: the CommitLog problem already names the place.
    """
    lowest = min(by_offset, default=0)
    seg = {}
    for p in unreadable:
        seg[int(Path(p.file).name)] = p.offset
    blind: dict[tuple[str, int], list] = {}
    for u in iter_cq_units(store_dir, odd):
        phy = u["commitlog_offset"]
        if u["size"] == units.CQ_FILL_SIZE or phy < lowest:
            continue  # filler, or data deleted by retention
        rec = by_offset.get(phy)
        want = (u["topic"], u["queue_id"], u["queue_offset"], u["size"])
        got = rec and (rec["topic"], rec["queue_id"], rec["queue_offset"], rec["size"])
        if got == want:
            continue
        cut = [start for base, start in seg.items() if base <= phy and start <= phy]
        if rec is None and cut:
            blind.setdefault((u["topic"], u["queue_id"]), []).append(u)
            continue
        pos = (u["queue_offset"] * units.CQ_UNIT_SIZE) % max(1, Path(u["file"]).stat().st_size)
        yield Problem(u["file"], pos, phy, "consumequeue", f"unit {want} but CommitLog has {got}")
    for (topic, qid), stranded in blind.items():
        first = stranded[0]
        yield Problem(
            first["file"],
            (first["queue_offset"] * units.CQ_UNIT_SIZE) % max(1, Path(first["file"]).stat().st_size),
            first["commitlog_offset"],
            "consumequeue",
            f"{topic}-{qid}: {len(stranded)} unit(s) from queue offset {first['queue_offset']} point past an "
            "unreadable CommitLog record",
        )


def verify_store(store_dir: Path) -> tuple[int, list[Problem]]:
    """``--verify``: every CommitLog problem (CRC, offset, length, torn tail) and every ConsumeQueue unit that
    does not point at its record; returns (records checked, problems)."""
    problems: list[Problem] = []
    odd: list[Problem] = []
    by_offset: dict[int, dict] = {}
    for item in iter_records(store_dir, odd=odd):
        if isinstance(item, Problem):
            problems.append(item)
        else:
            by_offset[item["offset"]] = item
    problems.extend(verify_consume_queues(store_dir, by_offset, list(problems), odd))
    for _ in iter_index_headers(store_dir, odd):
        pass
    return len(by_offset), problems + odd
