"""A store writer run in its own process by the crash-recovery tests (not a test module).

``python tests/store_writer_child.py '<json spec>'`` opens a MessageStore and appends messages until it is
killed (or until ``stop_after`` acks).  Every acknowledged message is logged, after its put returned
PUT_OK, to an acknowledgement log with one ``os.write`` on an ``O_APPEND`` descriptor per line:

    A <key> <queueId> <queueOffset> <commitlogOffset> <size> <bodyHex>
    F <flushedOffset> <acksSoFar>          (ASYNC_FLUSH: after an explicit flush of the CommitLog)
    Q <key> <phyOffset>,<phyOffset>...     (the index query results for a key, once, after ``query_after`` acks)
    QDONE
    HOLD                                   (after ``hold_after`` acks, once dispatch caught up; then it idles)
    STOPPED                                (clean shutdown after ``stop_after`` acks)

Spec keys: config (a whole MessageStoreConfig, by alias), ack_log, topic, queues, threads, body_size,
flush_every, query_after, stop_after, pace_ms, hold_after, die_in_append (SIGKILL itself inside that append),
via_send (put as the broker's send fast path does: ``MessageStore.put_send``, the run path where it declines; in
SYNC_FLUSH acknowledged once the group commit covers the record).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store.commitlog import AppendResult, AppendStatus  # noqa: E402
from store.config import MessageStoreConfig  # noqa: E402
from store.format import appender, msgid, native, properties, records, runs  # noqa: E402
from store.message_store import MessageStore, PutMessageResult, PutMessageStatus, Run  # noqa: E402
from tests import host_disk  # noqa: E402


def main() -> None:
    host_disk.pin()
    spec = json.loads(sys.argv[1])
    cfg = MessageStoreConfig(**spec["config"])
    topic = spec.get("topic", "CrashTopic")
    queues = spec.get("queues", 4)
    threads = spec.get("threads", 1)
    body_size = spec.get("body_size", 200)
    flush_every = spec.get("flush_every", 0)
    query_after = spec.get("query_after", 0)
    stop_after = spec.get("stop_after", 0)
    pace = spec.get("pace_ms", 0) / 1000
    hold_after = spec.get("hold_after", 0)
    via_send = spec.get("via_send", False)
    if spec.get("die_in_append"):
        _die_in_append(spec["die_in_append"])
    fd = os.open(spec["ack_log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    uniq = msgid.UniqKeyGenerator()
    store = MessageStore(cfg).start()
    acks = 0
    acks_lock = threading.Lock()
    stop = threading.Event()
    queried = threading.Event()

    def log(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    def writer(t: int) -> None:
        nonlocal acks
        seq = 0
        while not stop.is_set():
            key = f"k{t}-{seq}"
            qid = (seq + t) % queues
            seq += 1
            body = (f"{key}:".encode() * (body_size // 4 + 1))[:body_size]
            props = {"KEYS": key, "TAGS": f"tag{qid}", "UNIQ_KEY": uniq.next()}
            msg = records.MessageRecord(
                topic=topic,
                queue_id=qid,
                body=body,
                properties=properties.encode_properties(props),
                born_timestamp=time.time_ns() // 1_000_000,
                born_host=("127.0.0.1", 40000 + t),
            )
            put = send(msg) if via_send else store.put_message(msg)
            if put is None or put.status != PutMessageStatus.PUT_OK:
                continue
            a = put.append
            log(f"A {key} {qid} {a.queue_offset} {a.wrote_offset} {a.wrote_bytes} {body.hex()}")
            with acks_lock:
                acks += 1
                n = acks
                do_flush = threads == 1 and flush_every and n % flush_every == 0
                do_query = query_after and n >= query_after and not queried.is_set()
                if do_query:
                    queried.set()
            if do_flush:
                log(f"F {store.commitlog.queue.flush()} {n}")
            if do_query:
                query_all(t, seq)
            if stop_after and n >= stop_after:
                stop.set()
            if hold_after and n >= hold_after:
                # Stop writing once dispatch has caught up: ConsumeQueue and IndexFile now run ahead of the
                # last explicit flush. Then wait to be killed.
                deadline = time.monotonic() + 30
                while store.dispatch_behind_bytes > 0 and time.monotonic() < deadline:
                    time.sleep(0.001)
                log("HOLD")
                threading.Event().wait()
            if pace:
                time.sleep(pace)  # load shaping: a slower stream covers more wall-clock time per byte

    def send(msg: records.MessageRecord) -> PutMessageResult | None:
        """The broker's send fast path: put_send, else the run; durable first in SYNC_FLUSH (FlushAcks' rule)."""
        args = (msg.topic, msg.queue_id, msg.body, msg.properties, msg.flag, msg.sys_flag, msg.born_timestamp,
                msg.born_host, msg.reconsume_times, "CrashCluster")  # fmt: skip
        got = store.put_send(*args)
        if got is not None:
            _, offset, size, queue_offset = got
            res = PutMessageResult(PutMessageStatus.PUT_OK, AppendResult(AppendStatus.PUT_OK, offset, size, 0,
                                                                         queue_offset))  # fmt: skip
        else:
            run = runs.encode_message(*args[:8], store.store_host, msg.reconsume_times, "CrashCluster")
            res = store.put_nowait(Run(run, 1, msg.topic, msg.queue_id, msg.sys_flag), wait=False)[0]
            if not res.ok or res.append is None:
                return None
        commit = store.group_commit
        if commit is not None and not commit.submit(res.append.wrote_offset + res.append.wrote_bytes).result(30):
            return None
        return res

    def query_all(t: int, upto: int) -> None:
        deadline = time.monotonic() + 30
        while store.dispatch_behind_bytes > 0 and time.monotonic() < deadline:
            time.sleep(0.001)  # the index is built by dispatch, behind the puts
        for s in range(upto):
            key = f"k{t}-{s}"
            res = store.query_message(topic, key, 64, 0, 2**62)
            offs = sorted({records.read_physical_offset(m, 0) for m in res.messages})
            log(f"Q {key} {','.join(map(str, offs))}")
        log("QDONE")

    workers = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    store.shutdown()
    log("STOPPED")
    os.close(fd)


def _die_in_append(n: int) -> None:
    """Crash-point injection: SIGKILL this process inside the ``n``-th append, after the record's bytes
    were copied into the segment and before the append finished (at the back-fill of its offsets).  The
    compiled ``runs.write_run`` and ``records.put_record`` copy and back-fill in one call, so this writer runs
    their Python twins, which back-fill through ``records.patch_record`` (the twins write the same bytes:
    tests/test_send_runs.py, tests/test_put_record.py); so does the wire send's encoder, whose Python twin
    calls ``records.put_record`` (tests/test_appender.py)."""
    for name in ("prepare_send", "put_prepared"):
        setattr(appender, name, native.TWINS[appender.__name__].python[name])
    runs.write_run = native.TWINS[runs.__name__].python["write_run"]
    records.put_record = native.TWINS[records.__name__].python["put_record"]
    real = records.patch_record
    calls = 0

    def patch_record(buf, pos, *args):
        nonlocal calls
        calls += 1
        if calls == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(buf, pos, *args)

    records.patch_record = patch_record


if __name__ == "__main__":
    main()
