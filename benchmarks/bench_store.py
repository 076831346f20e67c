"""Store benchmarks: append, group commit, dispatch — each next to a raw baseline run alongside.

Run: ``.venv/bin/python -m benchmarks bench_store`` (or ``make bench``).

Environment:
  BENCH_SCALE    multiplies every message count and duration (default 1.0; 0.1 for a smoke run)
  BENCH_PROFILE  1: instead of the benchmark, print cProfile top functions (by tottime) of
                 ``MessageStore.put_message`` (1 KiB, ASYNC_FLUSH, reput idle) and of ``ReputService.do_reput``,
                 and the flush-interference test (mmap vs buffered pwrite beside an fdatasync thread)
  BENCH_JSON     a path: also write the JSON results there
  BENCH_SWITCH_INTERVAL  run with ``sys.setswitchinterval(value)`` (a diagnostic: GIL hand-off latency)
  MQLAKE_DISPATCH  ``reference``: the store dispatches on its per-record Python path even where the compiled
                 dispatch loop is built (an A/B of the loop alone; MQLAKE_NO_EXTENSIONS=1 turns off every twin)

What is timed, exactly:
  * Messages (``MessageRecord``) are built BEFORE timing: topic ``BenchTopic``, 4 queues round-robin, a fixed
    body per size, properties as the Java producer sends them (KEYS, TAGS, WAIT=true, UNIQ_KEY).  TAGS is fixed;
    KEYS (``ORDER-<10 digits>``) and UNIQ_KEY (MessageClientIDSetter format) are distinct per message but of
    fixed length, so every record of one size has the same length.
  * ``put_message`` is timed end to end on the calling thread (checks, encode, CRC, append under the lock,
    reput wake-up, msgId).  Segments are 256 MiB; the first segment AND the background preallocation of the
    next one are finished before the clock starts.
  * Baselines are the same encoded bytes copied into a preallocated (zero-written, fsynced) mmap, and plain
    ``write`` + ``fdatasync`` of 4 KiB.
  * MB/s counts encoded CommitLog record bytes, MB = 10^6 bytes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import cProfile
import gc
import io
import itertools
import json
import mmap
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.report import emit, machine
from store.commitlog import CommitLog
from store.config import FlushDiskType, MessageStoreConfig
from store.format import msgid, properties, records, runs
from store.mapped_file import preallocate
from store.message_store import MessageStore

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
SWITCH_INTERVAL = os.environ.get("BENCH_SWITCH_INTERVAL", "")  # seconds; empty = CPython's default (0.005)
SEGMENT = 256 * 1024 * 1024
SIZES = (100, 1024, 4096)
TOPIC = "BenchTopic"
QUEUES = 4
STORE_HOST = "127.0.0.1:10911"
BORN_HOST = ("10.0.0.7", 54321)

# Message counts / durations at BENCH_SCALE=1, chosen so that one size's run fits one 256 MiB segment.
ASYNC_COUNT = {100: 150_000, 1024: 150_000, 4096: 50_000}
SYNC_THREADS = (1, 16, 64)
SYNC_WINDOW = 64
SYNC_SECONDS = 3.0
FSYNC_SECONDS = 2.0
DISPATCH_COUNT = 100_000
SUSTAINED_RATE = 20_000
SUSTAINED_SECONDS = 5.0
SAMPLE_EVERY = 0.1

TARGET_ASYNC_1K = 250_000
TARGET_SYNC_64 = 20_000



def _n(count: int | float) -> int:
    return max(1, int(count * SCALE))


# =====================================================================================================
# helpers
# =====================================================================================================


def build_messages(body_size: int, count: int, start: int = 0) -> list[records.MessageRecord]:
    """``count`` ready-to-put messages of one size (built outside any timing)."""
    gen = msgid.UniqKeyGenerator()
    body = bytes((i * 7 + 3) & 0xFF for i in range(body_size))
    born = time.time_ns() // 1_000_000
    out = []
    for i in range(start, start + count):
        props = properties.encode_properties(
            {
                properties.PROPERTY_KEYS: f"ORDER-{i:010d}",
                properties.PROPERTY_TAGS: "TagA",
                properties.PROPERTY_WAIT_STORE_MSG_OK: "true",
                properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: gen.next(born),
            }
        )
        out.append(
            records.MessageRecord(
                topic=TOPIC, queue_id=i % QUEUES, body=body, properties=props, born_timestamp=born, born_host=BORN_HOST
            )
        )
    return out


def encode_all(msgs: list[records.MessageRecord]) -> list[bytearray]:
    host = _store_host()
    recs = []
    for m in msgs:
        m.store_host = host
        recs.append(records.encode_record(m))
    return recs


def _store_host() -> tuple[str, int]:
    host, _, port = STORE_HOST.rpartition(":")
    return host, int(port)


def store_config(root: Path, **kw) -> MessageStoreConfig:
    return MessageStoreConfig(
        store_path_root_dir=root, mapped_file_size_commit_log=SEGMENT, store_host=STORE_HOST, **kw
    )


@contextlib.contextmanager
def frozen_gc() -> Iterator[None]:
    """Move the pre-built messages out of the collector's way, as a broker would not hold them."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def measured() -> Iterator[CpuMeter]:
    """A timed region: collector frozen, CPU of this process and of the rest of the machine metered."""
    with frozen_gc(), CpuMeter() as cpu:
        yield cpu


@contextlib.contextmanager
def running_store(root: Path, **kw) -> Iterator[MessageStore]:
    store = MessageStore(store_config(root, **kw)).start()
    try:
        yield store
    finally:
        store.shutdown()


def warm(store: MessageStore, msg: records.MessageRecord) -> None:
    """Create the first segment (and let the next one's preallocation finish) before any timing."""
    res = store.put_message(msg)
    if not res.ok:
        raise RuntimeError(f"warm-up put failed: {res.status} {res.error}")
    store.commitlog.queue.wait_preallocated()


def pct(sorted_vals: list[float], p: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, round(p / 100 * (len(sorted_vals) - 1))))
    return sorted_vals[k]


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


CHUNKS = 5


def chunked(items: list, chunks: int = CHUNKS) -> list[list]:
    """Split a run into consecutive chunks, each timed on its own: the spread shows interference."""
    k = max(1, len(items) // chunks)
    out = [items[i : i + k] for i in range(0, len(items), k)]
    if len(out) > chunks:  # fold a short tail into the last chunk
        out[chunks - 1 :] = [[x for c in out[chunks - 1 :] for x in c]]
    return out


def timed_puts(put: Callable, items: list, size: Callable[[object], int] = lambda _: 1) -> tuple[list, list, int]:
    """Put ``items`` chunk by chunk, each chunk timed on its own: (messages per chunk, seconds, not stored)."""
    counts, secs, bad = [], [], 0
    for chunk in chunked(items):
        t0 = time.perf_counter()
        for item in chunk:
            if not put(item).ok:
                bad += size(item)
        secs.append(time.perf_counter() - t0)
        counts.append(sum(size(item) for item in chunk))
    return counts, secs, bad


def summarize(counts: list[int], seconds: list[float], bytes_per_item: float = 0.0) -> dict:
    """Median and range of per-chunk rates, plus the overall rate."""
    rates = sorted(rate(n, t) for n, t in zip(counts, seconds, strict=True))
    n, t = sum(counts), sum(seconds)
    med = statistics.median(rates)
    return {"msgs": n, "seconds": t, "msgs_per_s": med, "msgs_per_s_overall": rate(n, t),
            "msgs_per_s_min": rates[0], "msgs_per_s_max": rates[-1], "chunks": len(rates),
            "chunk_rates": [rate(n, t) for n, t in zip(counts, seconds, strict=True)],
            "mb_per_s": med * bytes_per_item / 1e6}  # fmt: skip


class CpuMeter:
    """CPU used during a timed region: by this process, and by everything else on the machine.

    Others share this 2-core machine (test suites, builds), so every figure carries the cores that other
    processes kept busy while it was measured; a figure taken beside a busy neighbour is not comparable.
    "Other" is machine-wide busy time minus this process's, so it includes kernel threads (writeback of
    our own dirty pages among them); regions shorter than MIN_WALL report NaN.
    """

    _TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    MIN_WALL = 0.25

    def __init__(self) -> None:
        self.own_cores = self.other_cores = self.steal_cores = float("nan")

    @staticmethod
    def _stat() -> tuple[float, float]:
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return float("nan"), float("nan")
        # user nice system idle iowait irq softirq steal ...
        busy = v[0] + v[1] + v[2] + v[5] + v[6]
        steal = v[7] if len(v) > 7 else 0
        return busy / CpuMeter._TICK, steal / CpuMeter._TICK

    def __enter__(self) -> CpuMeter:
        t = os.times()
        self._own = t.user + t.system
        self._busy, self._steal = self._stat()
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._wall
        t = os.times()
        own = t.user + t.system - self._own
        busy, steal = self._stat()
        if wall >= self.MIN_WALL:  # /proc/stat counts 10 ms ticks: shorter regions are noise
            self.own_cores = own / wall
            self.other_cores = max(0.0, (busy - self._busy - own) / wall)
            self.steal_cores = (steal - self._steal) / wall

    def as_dict(self) -> dict:
        return {"own_cpu_cores": self.own_cores, "other_cpu_cores": self.other_cores, "steal_cores": self.steal_cores}


def drain(store: MessageStore) -> int:
    n = 0
    while True:
        k = store.reput.do_reput()
        if k == 0:
            return n
        n += k


# =====================================================================================================
# 1. raw mmap baseline
# =====================================================================================================


def bench_raw_mmap(tmp: Path, recs: list[bytes]) -> dict:
    """The same encoded bytes copied record by record into a fresh prefilled mmap (the baseline), timed in
    chunks like the store runs; and once as one bulk copy (memory bandwidth, the ceiling)."""
    total = sum(len(r) for r in recs)
    size = max(total + 4096, 1 << 20)
    size += -size % (1 << 20)
    counts, secs = [], []
    bulk = 0.0
    with CpuMeter() as whole:  # over the whole baseline, prefill included
        for kind in ("loop", "bulk"):
            path = tmp / f"raw-{kind}"
            preallocate(path, size)
            fd = os.open(path, os.O_RDWR)
            mm = mmap.mmap(fd, size)
            view = memoryview(mm)
            try:
                with frozen_gc():
                    if kind == "loop":
                        pos = 0
                        for chunk in chunked(recs):
                            t0 = time.perf_counter()
                            for r in chunk:
                                n = len(r)
                                view[pos : pos + n] = r
                                pos += n
                            secs.append(time.perf_counter() - t0)
                            counts.append(len(chunk))
                    else:
                        blob = b"".join(recs)
                        t0 = time.perf_counter()
                        view[0:total] = blob
                        bulk = time.perf_counter() - t0
                        del blob
            finally:
                view.release()
                mm.close()
                os.close(fd)
                path.unlink()
    return {**summarize(counts, secs, total / len(recs)), "bytes": total, "bulk_copy_mb_per_s": total / bulk / 1e6,
            "other_cpu_cores": whole.other_cores}  # fmt: skip


# =====================================================================================================
# 2. CommitLog alone and the MessageStore facade, ASYNC_FLUSH
# =====================================================================================================


def bench_commitlog(tmp: Path, recs: list[bytes], batch: int) -> dict:
    """``CommitLog.put`` of pre-encoded records as runs of ``batch`` (``runs.put_run``): the lock + copy path."""
    d = tmp / f"cl-{batch}"
    cl = CommitLog(d / "commitlog", SEGMENT)
    keys = [f"{TOPIC}-{q}" for q in range(QUEUES)]
    put, put_run = cl.put, runs.put_run
    try:
        put(put_run, (recs[0], 1, True), keys[0], True)
        cl.queue.wait_preallocated()
        work = [bytearray(r) for r in recs]  # bytearray: also what an in-place back-fill would need
        counts, secs = [], []
        with measured() as cpu:
            for chunk in chunked(work):
                if batch == 1:
                    t0 = time.perf_counter()
                    for i, r in enumerate(chunk):
                        put(put_run, (r, 1, True), keys[i % QUEUES], True)
                    el = time.perf_counter() - t0
                else:
                    groups = [chunk[i : i + batch] for i in range(0, len(chunk), batch)]
                    t0 = time.perf_counter()
                    for i, g in enumerate(groups):
                        put(put_run, (b"".join(g), len(g), True), keys[i % QUEUES], True, len(g))
                    el = time.perf_counter() - t0
                counts.append(len(chunk))
                secs.append(el)
        return {**summarize(counts, secs, len(work[0])), "batch": batch, **cpu.as_dict()}
    finally:
        cl.close()
        shutil.rmtree(d, ignore_errors=True)


NO_FLUSH = {"flush_interval_commit_log": 600_000, "flush_commit_log_thorough_interval": 600_000}


def bench_put_batches(tmp: Path, msgs: list[records.MessageRecord], batch: int) -> dict:
    """``MessageStore.put_message`` with ``batch`` messages of one topic-queue per call (reput idle):
    what a batch send (one request, many messages) costs per message through the facade."""
    root = tmp / f"batch-{len(msgs[0].body)}-{batch}"
    per_queue: dict[int, list[records.MessageRecord]] = {}
    for m in msgs[1:]:
        per_queue.setdefault(m.queue_id, []).append(m)
    by_queue = [[ms[i : i + batch] for i in range(0, len(ms), batch)] for ms in per_queue.values()]
    groups = [g for round_ in itertools.zip_longest(*by_queue) for g in round_ if g]  # queues interleaved
    with running_store(root, flush_disk_type=FlushDiskType.ASYNC_FLUSH) as store:
        store.reput.shutdown()
        warm(store, msgs[0])
        with measured() as cpu:
            counts, secs, bad = timed_puts(store.put_message, groups, len)
        rec_len = len(records.encode_record(msgs[0]))
        drain(store)
    shutil.rmtree(root, ignore_errors=True)
    return {**summarize(counts, secs, rec_len), "failed": bad, "batch": batch, **cpu.as_dict()}


def bench_put_async(tmp: Path, msgs: list[records.MessageRecord], reput_running: bool, flush: bool = True) -> dict:
    """``put_message`` end to end.  ``flush=False`` keeps the ASYNC flush thread asleep during the run
    (a diagnostic: what its ``fdatasync`` of the mapped segment costs the appender)."""
    root = tmp / f"async-{len(msgs[0].body)}-{int(reput_running)}-{int(flush)}"
    with running_store(root, flush_disk_type=FlushDiskType.ASYNC_FLUSH, **({} if flush else NO_FLUSH)) as store:
        if not reput_running:
            store.reput.shutdown()
        warm(store, msgs[0])
        with measured() as cpu:
            counts, secs, bad = timed_puts(store.put_message, msgs[1:])
        rec_len = len(records.encode_record(msgs[0]))
        behind = store.dispatch_behind_bytes
        t1 = time.perf_counter()
        if reput_running:  # do_reput is not re-entrant: never call it beside the running thread
            while store.dispatch_behind_bytes > 0 and time.perf_counter() - t1 < 120:
                time.sleep(0.001)
        else:
            drain(store)
        drain_s = time.perf_counter() - t1
    shutil.rmtree(root, ignore_errors=True)
    return {**summarize(counts, secs, rec_len), "failed": bad, "record_bytes": rec_len,
            "dispatch_behind_bytes_at_end": behind, "drain_seconds_after": drain_s,
            "reput_running": reput_running, "flush_during_run": flush, **cpu.as_dict()}  # fmt: skip


# =====================================================================================================
# 3. SYNC_FLUSH group commit and the fdatasync baseline
# =====================================================================================================


FSYNC_MODES = {
    "append": "write+fdatasync 4 KiB, growing file",
    "in_place": "pwrite+fdatasync 4 KiB, prefilled file",
    "mmap": "mmap 1 KiB record+fdatasync, prefilled",
}


def bench_fdatasync(tmp: Path, seconds: float, mode: str, record: bytes = b"") -> dict:
    """Serial durable appends: ``write`` to a growing file, ``pwrite`` into a prefilled one, or one record
    copied into a prefilled mmap (what the CommitLog does) — each followed by ``fdatasync``."""
    path = tmp / f"fsync-{mode}"
    buf = bytes(range(256)) * 16
    size = 256 * 1024 * 1024
    if mode != "append":
        preallocate(path, size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    mm = mmap.mmap(fd, size) if mode == "mmap" else None
    view = memoryview(mm) if mm is not None else None
    rec = record or buf[:1024]
    n = len(rec)
    lat = []
    cpu = CpuMeter()
    try:
        pos = 0
        cpu.__enter__()
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while True:
            a = time.perf_counter_ns()
            if mode == "mmap":
                if pos + n > size:
                    pos = 0
                view[pos : pos + n] = rec
                pos += n
            elif mode == "in_place":
                os.pwrite(fd, buf, pos)
                pos = (pos + 4096) % size
            else:
                os.write(fd, buf)
            os.fdatasync(fd)
            b = time.perf_counter_ns()
            lat.append(b - a)
            if b / 1e9 >= deadline:
                break
        el = time.perf_counter() - t0
        cpu.__exit__(None, None, None)
    finally:
        if view is not None:
            view.release()
            mm.close()
        os.close(fd)
        path.unlink()
    lat.sort()
    return {"ops": len(lat), "ops_per_s": rate(len(lat), el), "p50_ms": pct(lat, 50) / 1e6,
            "p99_ms": pct(lat, 99) / 1e6, "mode": mode, **cpu.as_dict()}  # fmt: skip


class _FlushCounter:
    """Wraps ``MappedFileQueue.flush`` on one instance: how many group commits, and how long they took."""

    def __init__(self, queue) -> None:
        self._inner = queue.flush
        self.calls = 0
        self.seconds = 0.0
        queue.flush = self

    def reset(self) -> None:
        self.calls, self.seconds = 0, 0.0

    def __call__(self, *a, **kw):
        t = time.perf_counter()
        try:
            return self._inner(*a, **kw)
        finally:
            self.seconds += time.perf_counter() - t
            self.calls += 1


def _count_flushes(queue) -> _FlushCounter:
    return _FlushCounter(queue)


def bench_put_sync(tmp: Path, threads: int, seconds: float, pool: list[records.MessageRecord], window: int = 0) -> dict:
    """``threads`` writers each calling ``put_message`` (which waits for the group commit); or, with
    ``window``, ONE thread keeping ``window`` puts in flight via ``put_nowait`` and their futures —
    how an asyncio broker would drive the store (one wake-up per commit instead of one thread per request).
    """
    root = tmp / f"sync-{threads}-{window}"
    with running_store(root, flush_disk_type=FlushDiskType.SYNC_FLUSH) as store:
        warm(store, pool[0])
        flushes = _count_flushes(store.commitlog.queue)
        start = threading.Barrier(threads + 1)
        lats: list[list[int]] = [[] for _ in range(threads)]
        fails = [0] * threads
        deadline = [0.0]

        def writer(i: int) -> None:
            mine = pool[1 + i :: threads] or pool[1:]
            put = store.put_message
            out = lats[i]
            k = 0
            start.wait()
            end = deadline[0]
            while True:
                m = mine[k % len(mine)]
                k += 1
                a = time.perf_counter_ns()
                res = put(m)
                b = time.perf_counter_ns()
                if res.status.value == "PUT_OK":
                    out.append(b - a)
                else:
                    fails[i] += 1
                if b / 1e9 >= end:
                    break

        def pipelined(i: int) -> None:
            mine = pool[1:]
            nowait = store.put_nowait
            timeout = store.config.sync_flush_timeout / 1000
            out = lats[i]
            inflight: collections.deque = collections.deque()
            k = 0
            start.wait()
            end = deadline[0]
            while True:
                while len(inflight) < window:
                    m = mine[k % len(mine)]
                    k += 1
                    a = time.perf_counter_ns()
                    res, fut = nowait((m,))
                    if not res.ok or fut is None:
                        fails[i] += 1
                        continue
                    inflight.append((a, fut))
                a, fut = inflight.popleft()
                try:
                    ok = fut.result(timeout=timeout)
                except concurrent.futures.TimeoutError:
                    ok = False
                b = time.perf_counter_ns()
                if ok:
                    out.append(b - a)
                else:
                    fails[i] += 1
                if b / 1e9 >= end:
                    break
            for _, fut in inflight:  # let the rest land before the store shuts down
                with contextlib.suppress(concurrent.futures.TimeoutError):
                    fut.result(timeout=timeout)

        target = pipelined if window else writer
        ts = [threading.Thread(target=target, args=(i,), name=f"bench-writer-{i}") for i in range(threads)]
        for t in ts:
            t.start()
        flushes.reset()
        with measured() as cpu:
            deadline[0] = time.perf_counter() + seconds
            t0 = time.perf_counter()
            start.wait()
            for t in ts:
                t.join()
            el = time.perf_counter() - t0
            nflush, flush_s = flushes.calls, flushes.seconds
    shutil.rmtree(root, ignore_errors=True)
    lat = sorted(x for xs in lats for x in xs)
    own = cpu.own_cores * el
    return {"threads": threads, "window": window, "acked": len(lat), "failed_or_timeout": sum(fails), "seconds": el,
            "cpu_us_per_ack": own / len(lat) * 1e6 if lat else float("nan"),
            "acked_per_s": rate(len(lat), el), "p50_ms": pct(lat, 50) / 1e6, "p99_ms": pct(lat, 99) / 1e6,
            "max_ms": (lat[-1] / 1e6) if lat else float("nan"), "flushes": nflush,
            "flushes_per_s": rate(nflush, el), "msgs_per_flush": len(lat) / nflush if nflush else float("nan"),
            "flush_ms_mean": flush_s / nflush * 1e3 if nflush else float("nan"),
            "flush_busy_fraction": flush_s / el, **cpu.as_dict()}  # fmt: skip


# =====================================================================================================
# 4. dispatch: do_reput alone, and a sustained load with the real reput thread
# =====================================================================================================


def bench_do_reput(tmp: Path, msgs: list[records.MessageRecord], index: bool) -> dict:
    root = tmp / f"reput-{int(index)}"
    with running_store(root, message_index_enable=index) as store:
        store.reput.shutdown()  # the thread stops; do_reput is then called here, on this thread
        warm(store, msgs[0])
        for m in msgs[1:]:
            store.put_message(m)
        counts, secs = [], []
        with measured() as cpu:
            for chunk in chunked(msgs):
                t0 = time.perf_counter()
                n = store.reput.do_reput(limit=len(chunk))
                secs.append(time.perf_counter() - t0)
                counts.append(n)
            t0 = time.perf_counter()
            n = drain(store)  # nothing left, unless do_reput stopped early
            if n:
                secs.append(time.perf_counter() - t0)
                counts.append(n)
        behind = store.dispatch_behind_bytes
        cq_total = sum(store.get_max_offset_in_queue(TOPIC, q) for q in range(QUEUES))
        index_count = sum(f.header.index_count - 1 for f in store.index.files) if index else 0
    shutil.rmtree(root, ignore_errors=True)
    return {**summarize(counts, secs), "index": index, "behind_after": behind, "cq_units": cq_total,
            "index_entries": index_count, **cpu.as_dict()}  # fmt: skip


def bench_sustained(tmp: Path, msgs: list[records.MessageRecord], target_rate: int, seconds: float) -> dict:
    root = tmp / "sustained"
    total = len(msgs) - 1
    with running_store(root, flush_disk_type=FlushDiskType.ASYNC_FLUSH) as store:
        warm(store, msgs[0])
        drain_wait = time.perf_counter() + 2
        while store.dispatch_behind_bytes > 0 and time.perf_counter() < drain_wait:
            time.sleep(0.001)
        rec_len = store.commitlog.max_offset
        done = threading.Event()
        sent = [0]
        append_el = [0.0]

        def appender() -> None:
            put = store.put_message
            i = 0
            t0 = time.perf_counter()
            while i < total:
                due = min(total, int((time.perf_counter() - t0) * target_rate) + 1)
                while i < due:
                    put(msgs[1 + i])
                    i += 1
                sent[0] = i
                time.sleep(0.0005)
            append_el[0] = time.perf_counter() - t0
            done.set()

        samples: list[tuple[float, int]] = []
        with measured() as cpu:
            t = threading.Thread(target=appender, name="bench-appender")
            t0 = time.perf_counter()
            t.start()
            nxt = t0
            while not done.is_set():
                nxt += SAMPLE_EVERY
                time.sleep(max(0.0, nxt - time.perf_counter()))
                samples.append((time.perf_counter() - t0, store.dispatch_behind_bytes))
            t.join()
            final_lag = store.dispatch_behind_bytes
            t1 = time.perf_counter()
            while store.dispatch_behind_bytes > 0 and time.perf_counter() - t1 < 60:
                time.sleep(0.001)
            drain_s = time.perf_counter() - t1
    shutil.rmtree(root, ignore_errors=True)
    lags = [b for _, b in samples]
    # Least-squares slope of lag over time: a bounded lag has a slope near zero.
    xs = [x for x, _ in samples]
    slope = 0.0
    if len(samples) >= 2:
        mx, my = statistics.fmean(xs), statistics.fmean(lags)
        den = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in samples) / den if den else 0.0
    produced_bps = rec_len * target_rate
    per_second: dict[int, int] = {}
    for x, y in samples:
        per_second[int(x)] = max(per_second.get(int(x), 0), y)
    # Bounded: no upward trend (a dispatch deficit of 1% would show as a slope of 1% of the produced bytes/s)
    # and the backlog is gone within a second of the appender stopping.  Single spikes are not growth.
    bounded = slope < 0.01 * produced_bps and drain_s < 1.0
    return {"target_rate": target_rate, "sent": total, "achieved_rate": rate(total, append_el[0]),
            "record_bytes": rec_len, "samples": len(lags), "max_lag_bytes": max(lags, default=0),
            "max_lag_msgs": max(lags, default=0) / rec_len, "final_lag_bytes": final_lag,
            "mean_lag_bytes": statistics.fmean(lags) if lags else 0, "lag_slope_bytes_per_s": slope,
            "max_lag_per_second": [per_second[k] for k in sorted(per_second)],
            "drain_seconds_after_stop": drain_s, "bounded": bounded,
            "lag_series_bytes": lags, **cpu.as_dict()}  # fmt: skip


# =====================================================================================================
# machine, report
# =====================================================================================================


def codecs_line(m: dict) -> str:
    """Which codec twin this run measured (store.format.native): the compiled one, or the Python one and why."""
    loop = f"; dispatch: the {m['dispatch']} loop" if "dispatch" in m else ""
    if m.get("codecs") == "python":
        return f"codecs: the pure-Python twin ({m.get('codecs_why_python')}){loop}"
    return f"codecs: the compiled twin (MQLAKE_NO_EXTENSIONS=1 measures the Python one){loop}"


def _fmt_num(v: float) -> str:
    return f"{v:,.0f}"


def _bg(d: dict) -> str:
    v = d.get("other_cpu_cores", float("nan"))
    return f"{v:.2f}"


def print_report(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {m['nproc']} cores, {m['memory_gib']} GiB, {m['cpu']}, Python {m['python']}, {m['date']}")
    print(codecs_line(m))
    print(f"BENCH_SCALE={m['bench_scale']}; segment 256 MiB; MB = 10^6 bytes of encoded records; "
          f"sys.getswitchinterval() = {m.get('switch_interval', sys.getswitchinterval())}")  # fmt: skip
    print("bg cpu = cores kept busy by OTHER processes while the row was measured (0.00 = quiet machine)\n")

    print("1-2. append, ASYNC_FLUSH (messages pre-built; 4 queues; KEYS/TAGS/WAIT/UNIQ_KEY)")
    print("msgs/s = median of the per-chunk rates (each run is timed in 5 consecutive chunks); range = slowest and")
    print("fastest chunk, in thousands; vs raw = msgs/s over the raw mmap per-record copy of the same bytes")
    hdr = (f"{'path':<44}{'body':>6}{'rec B':>7}{'msgs':>8}{'msgs/s':>11}{'range k/s':>14}{'MB/s':>7}{'vs raw':>8}"
           f"{'bg cpu':>7}")  # fmt: skip
    print(hdr)
    print("-" * len(hdr))
    for size in SIZES:
        s = r["append"][str(size)]
        raw = s["raw_mmap"]
        rec = s["record_bytes"]
        rows = [
            ("raw mmap, per-record copy (baseline)", raw),
            ("raw mmap, one bulk copy (ceiling)", {"msgs": raw["msgs"], "msgs_per_s": raw["bulk_copy_mb_per_s"]
                                                  * 1e6 / rec, "mb_per_s": raw["bulk_copy_mb_per_s"],
                                                  "other_cpu_cores": raw["other_cpu_cores"]}),
            ("CommitLog.put, runs of 1 (pre-encoded)", s["commitlog_append"]),
            ("CommitLog.put, runs of 32 (pre-encoded)", s["commitlog_append_batch32"]),
            ("MessageStore.put_message, reput idle", s["put_async_reput_idle"]),
            ("MessageStore.put_message, reput running", s["put_async"]),
            ("  diagnostic: reput idle, flush thread asleep", s["put_async_reput_idle_no_flush"]),
            ("  diagnostic: put_message of 32, reput idle", s["put_batches32_reput_idle"]),
        ]  # fmt: skip
        for name, d in rows:
            ratio = d["msgs_per_s"] / raw["msgs_per_s"]
            rng = (f"{d['msgs_per_s_min'] / 1e3:,.0f}-{d['msgs_per_s_max'] / 1e3:,.0f}"
                   if "msgs_per_s_min" in d else "")  # fmt: skip
            print(f"{name:<44}{size:>6}{rec:>7}{d['msgs']:>8}{_fmt_num(d['msgs_per_s']):>11}{rng:>14}"
                  f"{d['mb_per_s']:>7,.0f}{ratio:>8.3f}{_bg(d):>7}")  # fmt: skip
        print()

    print("3. SYNC_FLUSH group commit, 1 KiB body (each put waits for its fdatasync)")
    print("   fsync/s, msg/fs: group commits per second and acked messages per commit; fs ms: mean duration of one")
    print("   commit's flush; fs %: share of the wall time the group-commit thread spent inside flush;")
    print("   us/ack: CPU time of this process (all threads) per acknowledged message")
    hdr = (f"{'path':<44}{'ops/s':>9}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'n':>7}{'fsync/s':>8}"
           f"{'msg/fs':>7}{'fs ms':>6}{'fs %':>5}{'us/ack':>7}{'bg cpu':>7}")  # fmt: skip
    print(hdr)
    print("-" * len(hdr))
    for mode, name in FSYNC_MODES.items():
        d = r["fdatasync"][mode]
        print(f"{name:<44}{_fmt_num(d['ops_per_s']):>9}{d['p50_ms']:>8.3f}{d['p99_ms']:>8.3f}{'':>8}{d['ops']:>7}"
              f"{_fmt_num(d['ops_per_s']):>8}{1:>7}{'':>6}{'':>5}{'':>7}{_bg(d):>7}")  # fmt: skip
    for key, d in r["sync"].items():
        if d["window"]:
            name = f"put_nowait, 1 thread, {d['window']} in flight"
        else:
            name = f"put_message SYNC_FLUSH, {key} writer thread(s)"
        print(f"{name:<44}{_fmt_num(d['acked_per_s']):>9}{d['p50_ms']:>8.3f}{d['p99_ms']:>8.3f}"
              f"{d['max_ms']:>8.1f}{d['acked']:>7}{_fmt_num(d['flushes_per_s']):>8}{d['msgs_per_flush']:>7.1f}"
              f"{d['flush_ms_mean']:>6.2f}{d['flush_busy_fraction'] * 100:>5.0f}{d['cpu_us_per_ack']:>7.0f}"
              f"{_bg(d):>7}")  # fmt: skip
    print()

    print("4. dispatch (1 KiB body; ConsumeQueue + IndexFile: UNIQ_KEY and 1 KEYS entry per message)")
    for key, name in (("do_reput_index", "do_reput, CQ + IndexFile"), ("do_reput_cq_only", "do_reput, CQ only")):
        d = r["dispatch"][key]
        print(f"  {name:<30}{_fmt_num(d['msgs_per_s']):>9} msgs/s (chunks {d['msgs_per_s_min']:,.0f}-"
              f"{d['msgs_per_s_max']:,.0f}; {d['msgs']} msgs in {d['seconds']:.2f} s; bg cpu {_bg(d)})")  # fmt: skip
    s = r["dispatch"]["sustained"]
    print(f"  sustained: target {s['target_rate']:,} msgs/s, achieved {s['achieved_rate']:,.0f} msgs/s, "
          f"{s['sent']} msgs, sampled every {SAMPLE_EVERY * 1000:.0f} ms; bg cpu {_bg(s)},"
          f" this process {s['own_cpu_cores']:.2f} cores")  # fmt: skip
    print(
        f"    dispatch lag: max {s['max_lag_bytes']:,} B (~{s['max_lag_msgs']:.0f} msgs), final "
        f"{s['final_lag_bytes']:,} B, mean {s['mean_lag_bytes']:,.0f} B, slope {s['lag_slope_bytes_per_s']:,.0f} B/s,"
        f" drained {s['drain_seconds_after_stop']:.3f} s after stop -> {'BOUNDED' if s['bounded'] else 'GROWING'}"
    )
    print("    max lag per second (KiB): " + " ".join(f"{v / 1024:,.0f}" for v in s["max_lag_per_second"]))
    print()

    print("targets")
    for t in r["targets"]:
        print(
            f"  {t['name']}: {t['measured']:,.0f} vs {t['target']:,} -> {'MET' if t['met'] else 'NOT MET'}"
            f" ({t['measured'] / t['target']:.2f}x of target)"
        )


def run_all(tmp: Path) -> dict:
    r: dict = {"machine": machine(), "append": {}, "sync": {}, "fdatasync": {}, "dispatch": {}}
    for size in SIZES:
        n = _n(ASYNC_COUNT[size])
        print(f"  [append {size} B x {n}]", flush=True)
        msgs = build_messages(size, n + 1)
        recs = encode_all(msgs[1:])
        s: dict = {"record_bytes": len(recs[0])}
        s["raw_mmap"] = bench_raw_mmap(tmp, recs)
        s["commitlog_append"] = bench_commitlog(tmp, recs, 1)
        s["commitlog_append_batch32"] = bench_commitlog(tmp, recs, 32)
        del recs
        s["put_async_reput_idle"] = bench_put_async(tmp, msgs, reput_running=False)
        s["put_async"] = bench_put_async(tmp, msgs, reput_running=True)
        s["put_async_reput_idle_no_flush"] = bench_put_async(tmp, msgs, reput_running=False, flush=False)
        s["put_batches32_reput_idle"] = bench_put_batches(tmp, msgs, 32)
        raw = s["raw_mmap"]["msgs_per_s"]
        for k in (
            "commitlog_append",
            "commitlog_append_batch32",
            "put_async_reput_idle",
            "put_async",
            "put_async_reput_idle_no_flush",
            "put_batches32_reput_idle",
        ):
            s[k]["ratio_to_raw_mmap"] = s[k]["msgs_per_s"] / raw
        r["append"][str(size)] = s
        del msgs

    print("  [fdatasync baselines]", flush=True)
    pool = build_messages(1024, _n(60_000) + 1)
    one = encode_all(pool[:1])[0]
    for mode in FSYNC_MODES:
        r["fdatasync"][mode] = bench_fdatasync(tmp, FSYNC_SECONDS * SCALE, mode, one)
    for t in SYNC_THREADS:
        print(f"  [SYNC_FLUSH {t} threads]", flush=True)
        r["sync"][str(t)] = bench_put_sync(tmp, t, SYNC_SECONDS * SCALE, pool)
    print(f"  [SYNC_FLUSH 1 thread, {SYNC_WINDOW} in flight]", flush=True)
    r["sync"][f"1x{SYNC_WINDOW}"] = bench_put_sync(tmp, 1, SYNC_SECONDS * SCALE, pool, window=SYNC_WINDOW)
    del pool
    for d in r["sync"].values():
        for mode in FSYNC_MODES:
            d[f"ratio_to_serial_{mode}"] = d["acked_per_s"] / r["fdatasync"][mode]["ops_per_s"]

    print("  [dispatch]", flush=True)
    msgs = build_messages(1024, _n(DISPATCH_COUNT) + 1)
    r["dispatch"]["do_reput_index"] = bench_do_reput(tmp, msgs, index=True)
    r["dispatch"]["do_reput_cq_only"] = bench_do_reput(tmp, msgs, index=False)
    del msgs
    print("  [sustained dispatch]", flush=True)
    secs = max(2.0, SUSTAINED_SECONDS * SCALE)  # shorter runs cannot show a trend
    msgs = build_messages(1024, int(SUSTAINED_RATE * secs) + 1)
    r["dispatch"]["sustained"] = bench_sustained(tmp, msgs, SUSTAINED_RATE, secs)
    del msgs

    a1k = r["append"]["1024"]["put_async"]["msgs_per_s"]
    a1k_idle = r["append"]["1024"]["put_async_reput_idle"]["msgs_per_s"]
    s64 = r["sync"]["64"]["acked_per_s"]
    sus = r["dispatch"]["sustained"]
    r["targets"] = [
        {"name": "ASYNC put_message 1 KiB (reput running)", "target": TARGET_ASYNC_1K, "measured": a1k,
         "met": a1k >= TARGET_ASYNC_1K},
        {"name": "ASYNC put_message 1 KiB (reput idle)", "target": TARGET_ASYNC_1K, "measured": a1k_idle,
         "met": a1k_idle >= TARGET_ASYNC_1K},
        {"name": "SYNC_FLUSH 64 writers, acked msgs/s", "target": TARGET_SYNC_64, "measured": s64,
         "met": s64 >= TARGET_SYNC_64},
        {"name": f"sustained {SUSTAINED_RATE:,} msgs/s with dispatch lag bounded (achieved rate)",
         "target": SUSTAINED_RATE, "measured": sus["achieved_rate"],
         "met": sus["bounded"] and sus["achieved_rate"] >= 0.98 * SUSTAINED_RATE},
    ]  # fmt: skip
    return r


# =====================================================================================================
# profiling (BENCH_PROFILE=1)
# =====================================================================================================


def _profile(fn: Callable[[], None], top: int = 10) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def _tlb_shootdowns() -> int:
    with contextlib.suppress(OSError), open("/proc/interrupts") as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == "TLB:":
                return sum(int(x) for x in parts[1:] if x.isdigit())
    return -1


def flush_interference(tmp: Path, msgs: list[records.MessageRecord]) -> list[dict]:
    """Encode + write each record while another thread of this process runs ``fdatasync`` every 100 ms.

    Writes through a shared writable mapping (what the CommitLog does) vs. into a 1 MiB user buffer written
    out with ``pwrite`` (RocketMQ's transientStorePool idea).  Cleaning the mapped pages for writeback makes
    the kernel write-protect them and shoot down the writer's TLB entries (an IPI per batch of pages).
    """
    recs_in = msgs
    for m in recs_in:
        m.store_host = _store_host()
    size = len(records.encode_record(recs_in[0])) * len(recs_in) + (2 << 20)
    size += -size % (1 << 20)
    out = []
    for mode in ("mmap", "buffer+pwrite"):
        for flush in (False, True):
            path = tmp / "interference"
            preallocate(path, size)
            fd = os.open(path, os.O_RDWR)
            mm = mmap.mmap(fd, size)
            view = memoryview(mm)
            stop = threading.Event()

            def flusher(fd: int = fd, stop: threading.Event = stop) -> None:
                while not stop.wait(0.1):
                    os.fdatasync(fd)

            t = threading.Thread(target=flusher, name="bench-flusher")
            if flush:
                t.start()
            enc, pwrite = records.encode_record, os.pwrite
            pos = 0
            with frozen_gc():
                tlb0 = _tlb_shootdowns()
                t0 = time.perf_counter()
                if mode == "mmap":
                    for m in recs_in:
                        r = enc(m)
                        n = len(r)
                        view[pos : pos + n] = r
                        pos += n
                else:
                    buf = bytearray(1 << 20)
                    bv = memoryview(buf)
                    bpos = 0
                    for m in recs_in:
                        r = enc(m)
                        n = len(r)
                        if bpos + n > len(buf):
                            pwrite(fd, bv[:bpos], pos)
                            pos += bpos
                            bpos = 0
                        bv[bpos : bpos + n] = r
                        bpos += n
                    pwrite(fd, bv[:bpos], pos)
                    bv.release()
                el = time.perf_counter() - t0
                tlb = _tlb_shootdowns() - tlb0
            stop.set()
            if flush:
                t.join()
            view.release()
            mm.close()
            os.close(fd)
            path.unlink()
            out.append({"mode": mode, "fdatasync_thread": flush, "msgs_per_s": rate(len(recs_in), el),
                        "tlb_shootdowns": tlb})  # fmt: skip
    return out


def profile(tmp: Path) -> dict:
    """BENCH_PROFILE=1: where the time goes, for whoever optimises the store."""
    n = _n(100_000)
    msgs = build_messages(1024, n + 1)
    out = {}
    # The flush thread is kept asleep so that its kernel-side interference (measured below) does not
    # smear into whichever Python function happens to be writing.
    with running_store(tmp / "prof-put", flush_disk_type=FlushDiskType.ASYNC_FLUSH, **NO_FLUSH) as store:
        store.reput.shutdown()
        warm(store, msgs[0])
        put = store.put_message

        def puts() -> None:
            for m in msgs[1:]:
                put(m)

        with frozen_gc():
            out["put_message"] = _profile(puts)
        with frozen_gc():
            out["do_reput"] = _profile(lambda: drain(store))
    for k, v in out.items():
        print(f"--- cProfile: {k} ({n} x 1 KiB, ASYNC_FLUSH, flush thread asleep), top 10 by tottime ---")
        print(v)
    print("--- flush interference: encode + write 1 KiB records, with/without an fdatasync thread (100 ms) ---")
    res = flush_interference(tmp, build_messages(1024, _n(300_000)))
    for d in res:
        print(f"  {d['mode']:<15} fdatasync thread {'on ' if d['fdatasync_thread'] else 'off'}"
              f" {d['msgs_per_s']:>12,.0f} msgs/s   TLB shootdowns {d['tlb_shootdowns']:>7,}")  # fmt: skip
    out["flush_interference"] = res
    return out


# =====================================================================================================


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-", dir="/tmp") as d:
        tmp = Path(d)
        if os.environ.get("BENCH_PROFILE", "") not in ("", "0"):
            return profile(tmp)
        old_si = sys.getswitchinterval()
        if SWITCH_INTERVAL:
            sys.setswitchinterval(float(SWITCH_INTERVAL))
        try:
            t0 = time.perf_counter()
            results = run_all(tmp)
            results["wall_seconds"] = time.perf_counter() - t0
            results["machine"]["switch_interval"] = sys.getswitchinterval()
        finally:
            sys.setswitchinterval(old_si)
    slim = json.loads(json.dumps(results))
    slim["dispatch"]["sustained"].pop("lag_series_bytes", None)
    return emit("bench_store", results, print_report, slim)


if __name__ == "__main__":
    main()
