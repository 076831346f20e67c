# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``store.commitlog.put``, the CommitLog's one locked section (the reference; its docstring says
what it does).  The same steps on the same objects, without the interpreter's cost per step; the encoder it calls
is the caller's, compiled or not."""

from libc.stdint cimport int64_t
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

from store.format.records import END_FILE_MIN_BLANK_LENGTH

cdef object _AppendResult = None
cdef object _OK, _NOT_WRITABLE, _TOO_BIG


cdef void _results():
    # the result classes, from the module that installs this one (imported once it is whole)
    global _AppendResult, _OK, _NOT_WRITABLE, _TOO_BIG
    from store.commitlog import AppendResult, AppendStatus
    _AppendResult = AppendResult
    _OK, _NOT_WRITABLE, _TOO_BIG = AppendStatus.PUT_OK, AppendStatus.NOT_WRITABLE, AppendStatus.MESSAGE_SIZE_EXCEEDED


def put(cl, encode, item, key, bint advances, count=1):
    """Mirrors ``store.commitlog.put``."""
    cdef timespec now
    cdef int64_t store_ts
    if _AppendResult is None:
        _results()
    lock = cl.put_lock
    lock.acquire()
    try:
        if not cl.writable:
            return _AppendResult(_NOT_WRITABLE)
        clock_gettime(CLOCK_REALTIME, &now)
        store_ts = <int64_t>now.tv_sec * 1000 + now.tv_nsec // 1000000
        ts = store_ts
        cl.begin_time_in_lock = ts
        try:
            queue = cl.queue
            files = queue.files
            mf = files[len(files) - 1] if files else None
            if mf is None or mf.wrote >= mf.file_size:
                mf = queue.last_or_new()
            table = cl.topic_queue_table
            queue_offset = table.get(key, 0) if advances else 0
            limit = cl.file_size - END_FILE_MIN_BLANK_LENGTH
            for fresh in (False, True):
                start = mf.wrote
                base = mf.file_from_offset
                n = encode(mf.view, start, limit, item, queue_offset, base + start, ts)
                if n >= 0:
                    break
                if fresh or -n > limit:
                    return _AppendResult(_TOO_BIG)
                cl.write_blank(mf)
                mf = queue.last_or_new()
            mf.wrote = start + n
            mf.last_store_timestamp = ts
            cl.last_store_timestamp = ts
            if advances:
                table[key] = queue_offset + count
        finally:
            cl.begin_time_in_lock = 0
    finally:
        lock.release()
    return _AppendResult(_OK, base + start, n, ts, queue_offset, count)
