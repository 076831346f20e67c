# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``store.commitlog.put``, the CommitLog's one locked section, and of ``SendPut`` (the
references; their docstrings say what they do).  The same steps on the same objects, without the interpreter's
cost per step; the encoder the section calls is the caller's, compiled or not."""

from cpython.object cimport PyObject, PyTypeObject
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec
from store.format._appender cimport Prepared, write_prepared
from store.format._bigendian cimport _fits64
from store.format._slots cimport _fill, _get, _slot

import struct

from store.format import appender, records
from store.format._appender import put_prepared as _put_prepared
from store.format.delay import PARK_MARKERS
from store.format.msgid import create_offset_msg_id
from store.format.records import (
    END_FILE_MIN_BLANK_LENGTH, MAX_PROPERTIES_LENGTH, MAX_TOPIC_LENGTH_V1, MessageRecord,
)

cdef bytes _DELAY = PARK_MARKERS[0]
cdef bytes _TIMER = PARK_MARKERS[1]


cdef extern from "string.h":
    void* memmem(const void* haystack, size_t haystack_len, const void* needle, size_t needle_len) nogil


cdef inline bint _has(bytes data, bytes part):
    # ``part in data`` without the TypeError bytes.__contains__ raises and clears for a bytes operand
    return memmem(<const char*>data, len(data), <const char*>part, len(part)) != NULL

cdef object _AppendResult = None
cdef object _OK, _NOT_WRITABLE, _TOO_BIG
cdef tuple _NO_ARGS = ()
# where an AppendResult holds its fields, in the order of its __init__
_FIELDS = ("status", "wrote_offset", "wrote_bytes", "store_timestamp", "queue_offset", "msg_num")
cdef Py_ssize_t _at[6]


cdef int _results() except -1:
    # the result classes, from the module that installs this one (imported once it is whole)
    global _AppendResult, _OK, _NOT_WRITABLE, _TOO_BIG
    from store.commitlog import AppendResult, AppendStatus
    for i, name in enumerate(_FIELDS):
        _at[i] = _slot(AppendResult, name)
    _AppendResult = AppendResult
    _OK, _NOT_WRITABLE, _TOO_BIG = AppendStatus.PUT_OK, AppendStatus.NOT_WRITABLE, AppendStatus.MESSAGE_SIZE_EXCEEDED
    return 0


cdef object _done(object offset, object n, object ts, object queue_offset, object count):
    """``AppendResult(PUT_OK, …)`` without its ``__init__``: each slot filled straight (what ``__init__`` does
    with six ``setattr`` calls, a third of the section's cost)."""
    result = (<PyTypeObject*>_AppendResult).tp_new(_AppendResult, <PyObject*>_NO_ARGS, NULL)
    _fill(result, _at[0], _OK)
    _fill(result, _at[1], offset)
    _fill(result, _at[2], n)
    _fill(result, _at[3], ts)
    _fill(result, _at[4], queue_offset)
    _fill(result, _at[5], count)
    return result


def put(cl, encode, item, key, bint advances, count=1):
    """Mirrors ``store.commitlog.put``."""
    return _put(cl, encode, item, key, advances, count)


cdef object _put(cl, encode, item, key, bint advances, count):
    cdef bint direct = encode is _put_prepared and type(item) is Prepared
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
                phys = base + start
                if (direct and type(start) is int and type(limit) is int and start <= 0x7FFFFFFFFFFF
                        and limit <= 0x7FFFFFFFFFFF and _fits64(queue_offset) and _fits64(phys)):
                    # put_prepared's checks passed: its writer called straight, without a Python call
                    n = write_prepared(<Prepared>item, mf.view, start, limit, queue_offset, phys, store_ts)
                else:
                    n = encode(mf.view, start, limit, item, queue_offset, phys, ts)
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
    return _done(base + start, n, ts, queue_offset, count)


cdef const char* _HEX = b"0123456789ABCDEF"


cdef class FastPut:
    """Mirrors ``store.commitlog.FastPut``."""

    cdef public bint enabled
    cdef public object listeners
    cdef object _cl, _config, _store_host, _notify, _prepare, _encode_send, _encode, _put_result, _put_ok
    cdef bytes _host_hex
    cdef Py_ssize_t _p_at[4]

    def __init__(self, cl, config, store_host, notify, put_result, put_ok):
        self._cl, self._config, self._store_host, self._notify = cl, config, store_host, notify
        self._put_result, self._put_ok = put_result, put_ok
        for i, name in enumerate(("status", "append", "msg_ids", "error")):
            self._p_at[i] = _slot(put_result, name)
        self._prepare, self._encode_send = appender.prepare_send, appender.put_prepared
        self._encode = records.put_record
        zero = create_offset_msg_id(store_host, 0)  # the store host's hex, then the offset's 16 digits
        self._host_hex = zero[: len(zero) - 16].encode("ascii")
        self.enabled = False
        self.listeners = []

    def put_record(self, rec):
        if not self.enabled or type(rec) is not MessageRecord:
            return None
        props, body, topic, sys_flag = rec.properties, rec.body, rec.topic, rec.sys_flag
        if type(props) is not bytes or type(body) is not bytes or type(topic) is not str or type(sys_flag) is not int:
            return None
        if not 0 < len(<str>topic) <= MAX_TOPIC_LENGTH_V1:
            return None
        if len(<bytes>body) > self._config.max_message_size or len(<bytes>props) > MAX_PROPERTIES_LENGTH:
            return None
        if _has(<bytes>props, _DELAY) or _has(<bytes>props, _TIMER):  # delay.may_park
            return None
        if (sys_flag & 0xC) not in (0, 8):  # records.is_consumable
            return None
        rec.store_host = self._store_host
        res = self._put(self._encode, rec, f"{topic}-{rec.queue_id}")
        if res is None:
            return None
        result = (<PyTypeObject*>self._put_result).tp_new(self._put_result, <PyObject*>_NO_ARGS, NULL)
        _fill(result, self._p_at[0], self._put_ok)
        _fill(result, self._p_at[1], res)
        _fill(result, self._p_at[2], [self._msg_id(<uint64_t>(_get(res, _at[1]) & 0xFFFFFFFFFFFFFFFF))])
        _fill(result, self._p_at[3], "")
        return result

    def put_send(self, topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host, reconsume_times,
                 cluster):
        if not self.enabled:
            return None
        item = self._prepare(
            topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host, reconsume_times, cluster,
            self._store_host, self._config.max_message_size,
        )
        if item is None:
            return None
        res = self._put(self._encode_send, item, f"{topic}-{queue_id}")
        if res is None:
            return None
        offset = _get(res, _at[1])
        return (self._msg_id(<uint64_t>(offset & 0xFFFFFFFFFFFFFFFF)), offset, _get(res, _at[2]),
                _get(res, _at[4]))

    cdef object _put(self, encode, item, key):
        if _AppendResult is None:
            _results()
        try:
            res = _put(self._cl, encode, item, key, True, 1)
        except (OSError, ValueError, struct.error):
            return None
        if _get(res, _at[0]) is not _OK:
            return None
        self._notify()
        if self.listeners:
            end = _get(res, _at[1]) + _get(res, _at[2])
            for listener in self.listeners:
                listener(end)
        return res

    cdef str _msg_id(self, uint64_t offset):
        # msgid.create_offset_msg_id: the store host's hex (fixed) and the offset's 16 upper-case hex digits
        cdef char buf[64]
        cdef Py_ssize_t n = len(self._host_hex), i
        memcpy(buf, <const char*>self._host_hex, n)
        for i in range(16):
            buf[n + 15 - i] = _HEX[offset & 0xF]
            offset >>= 4
        return PyUnicode_DecodeASCII(buf, n + 16, NULL)
