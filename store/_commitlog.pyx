# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``store.commitlog.put``, the CommitLog's one locked section, and of ``FastPut`` (the
references; their docstrings say what they do).  The same steps on the same objects, without the interpreter's
cost per step: offsets and times are C integers, a compiled encoder (``store.format._records.Encoder``) is called
through its C entry, and ``FastPut`` reads a section's outcome from a C struct, so a put makes no object the
reference's answer does not hold."""

from cpython.object cimport PyObject, PyTypeObject
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec
from store.format._appender cimport may_park, prepare
from store.format._bigendian cimport _fits64
from store.format._records cimport Encoder
from store.format._slots cimport _fill, _get, _replace, _slot

import struct

from store.format import _appender
from store.format.msgid import create_offset_msg_id
from store.format.records import (
    END_FILE_MIN_BLANK_LENGTH, MAX_PROPERTIES_LENGTH, MAX_TOPIC_LENGTH_V1, MessageRecord,
)

cdef Py_ssize_t _BLANK_MIN = END_FILE_MIN_BLANK_LENGTH
cdef int64_t _LONG_MAX = 0x7FFFFFFFFFFFFFFF


cdef enum Status:
    PUT_OK
    NOT_WRITABLE
    TOO_BIG


cdef struct Appended:
    # where a section's records went, as AppendResult holds it
    Status status
    int64_t offset, store_ts, queue_offset
    Py_ssize_t n


cdef object _AppendResult = None
cdef object _OK, _NOT_WRITABLE, _TOO_BIG
cdef tuple _NO_ARGS = ()
# where an AppendResult holds its fields, in the order of its __init__
_FIELDS = ("status", "wrote_offset", "wrote_bytes", "store_timestamp", "queue_offset", "msg_num")
cdef Py_ssize_t _at[6]
# MessageRecord's fields FastPut.put_record reads or sets
_RECORD_FIELDS = ("topic", "body", "properties", "sys_flag", "queue_id", "store_host")
cdef Py_ssize_t _r_at[6]
for _i, _name in enumerate(_RECORD_FIELDS):
    _r_at[_i] = _slot(MessageRecord, _name)


cdef int _results() except -1:
    # the result classes, from the module that installs this one (imported once it is whole)
    global _AppendResult, _OK, _NOT_WRITABLE, _TOO_BIG
    from store.commitlog import AppendResult, AppendStatus
    for i, name in enumerate(_FIELDS):
        _at[i] = _slot(AppendResult, name)
    _AppendResult = AppendResult
    _OK, _NOT_WRITABLE, _TOO_BIG = AppendStatus.PUT_OK, AppendStatus.NOT_WRITABLE, AppendStatus.MESSAGE_SIZE_EXCEEDED
    return 0


cdef object _bare(object cls):
    # an instance of a slots dataclass, its fields unset: the caller fills each (what __init__ does with a
    # setattr per field, at a fraction of the cost)
    return (<PyTypeObject*>cls).tp_new(cls, <PyObject*>_NO_ARGS, NULL)


cdef object _append_result(Appended* a, Py_ssize_t count):
    """``AppendResult(PUT_OK, …)``, each slot filled straight."""
    result = _bare(_AppendResult)
    _fill(result, _at[0], _OK)
    _fill(result, _at[1], a.offset)
    _fill(result, _at[2], a.n)
    _fill(result, _at[3], a.store_ts)
    _fill(result, _at[4], a.queue_offset)
    _fill(result, _at[5], count)
    return result


def put(cl, encode, item, key, bint advances, count=1):
    """Mirrors ``store.commitlog.put``."""
    cdef Appended a
    if _AppendResult is None:
        _results()
    lock = cl.put_lock
    _section(cl, lock.acquire, lock.release, cl.queue, cl.file_size, encode, item, key, advances, count, &a)
    if a.status == NOT_WRITABLE:
        return _AppendResult(_NOT_WRITABLE)
    if a.status == TOO_BIG:
        return _AppendResult(_TOO_BIG)
    return _append_result(&a, count)


cdef inline bint _show(cl, ts, bint shown) except -1:
    # the section's CommitLog.begin_time_in_lock, set once
    if not shown:
        cl.begin_time_in_lock = ts
    return True


cdef int _section(cl, acquire, release, queue, Py_ssize_t file_size, encode, item, key, bint advances,
                  Py_ssize_t count, Appended* out) except -1:
    """``put``'s locked section, its outcome in ``out``; ``acquire``, ``release``, ``queue`` and ``file_size``
    are ``cl``'s (its lock's methods, its segments and their size), which FastPut holds."""
    cdef timespec now
    cdef int64_t store_ts, queue_offset = 0, base
    cdef Py_ssize_t start, limit, n = 0
    cdef int fresh
    # CommitLog.begin_time_in_lock is set only while other threads may run inside the section: before a roll
    # (file I/O) and a call to an encoder that is not compiled.  Elsewhere the GIL is held from the lock to its
    # release, so no other thread could see it set.
    cdef bint shown = False
    acquire()
    try:
        if not cl.writable:
            out.status = NOT_WRITABLE
            return 0
        clock_gettime(CLOCK_REALTIME, &now)
        store_ts = <int64_t>now.tv_sec * 1000 + now.tv_nsec // 1000000
        ts = store_ts
        try:
            files = queue.files
            mf = files[len(files) - 1] if files else None
            wrote = mf.wrote if mf is not None else None
            if mf is None or wrote >= mf.file_size:
                shown = _show(cl, ts, shown)
                mf = queue.last_or_new()
                wrote = mf.wrote
            table = cl.topic_queue_table
            if advances:
                value = (<dict>table).get(key, 0) if type(table) is dict else table.get(key, 0)
                if not _fits64(value) or value > _LONG_MAX - count:
                    raise struct.error(f"queue offset {value!r} of {key!r} out of its field's range")
                queue_offset = value
            limit = file_size - _BLANK_MIN
            for fresh in range(2):  # at most one roll: a new segment holds whatever fits one
                start = wrote
                base = mf.file_from_offset
                if isinstance(encode, Encoder):
                    n = (<Encoder>encode).write(mf.view, start, limit, item, queue_offset, base + start, store_ts)
                else:
                    shown = _show(cl, ts, shown)
                    n = encode(mf.view, start, limit, item, queue_offset, base + start, ts)
                if n >= 0:
                    break
                if fresh or -n > limit:
                    out.status = TOO_BIG
                    return 0
                shown = _show(cl, ts, shown)
                cl.write_blank(mf)
                mf = queue.last_or_new()
                wrote = mf.wrote
            mf.wrote = start + n
            mf.last_store_timestamp = ts
            cl.last_store_timestamp = ts
            if advances:
                if type(table) is dict:
                    (<dict>table)[key] = queue_offset + count
                else:
                    table[key] = queue_offset + count
        finally:
            if shown:
                cl.begin_time_in_lock = 0
    finally:
        release()
    out.status = PUT_OK
    out.offset = base + start
    out.n = n
    out.store_ts = store_ts
    out.queue_offset = queue_offset
    return 0


cdef const char* _HEX = b"0123456789ABCDEF"


cdef class FastPut:
    """Mirrors ``store.commitlog.FastPut``."""

    cdef public bint enabled
    cdef bint _compiled_prepare  # prepare_send is this build's: called straight
    cdef public object listeners
    cdef Py_ssize_t _file_size
    cdef object _cl, _acquire, _release, _queue, _config, _store_host, _notify, _prepare, _encode_send, _encode
    cdef object _put_result, _put_ok
    cdef dict _keys  # topic -> {queue id: its key in CommitLog.topic_queue_table}
    cdef bytes _host_hex
    cdef Py_ssize_t _p_at[4]

    def __init__(self, cl, config, store_host, notify, put_result, put_ok):
        from store.format import appender, records
        self._cl, self._config, self._store_host, self._notify = cl, config, store_host, notify
        self._acquire, self._release, self._queue = cl.put_lock.acquire, cl.put_lock.release, cl.queue
        self._file_size = cl.file_size
        self._put_result, self._put_ok = put_result, put_ok
        for i, name in enumerate(("status", "append", "msg_ids", "error")):
            self._p_at[i] = _slot(put_result, name)
        self._prepare, self._encode_send = appender.prepare_send, appender.put_prepared
        self._encode = records.put_record
        self._compiled_prepare = self._prepare is _appender.prepare_send
        self._keys = {}
        zero = create_offset_msg_id(store_host, 0)  # the store host's hex, then the offset's 16 digits
        self._host_hex = zero[: len(zero) - 16].encode("ascii")
        self.enabled = False
        self.listeners = []

    def put_record(self, rec):
        cdef Appended a
        if not self.enabled or type(rec) is not MessageRecord:
            return None
        topic, body, props, sys_flag = _get(rec, _r_at[0]), _get(rec, _r_at[1]), _get(rec, _r_at[2]), _get(rec, _r_at[3])
        if type(props) is not bytes or type(body) is not bytes or type(topic) is not str or type(sys_flag) is not int:
            return None
        if not 0 < len(<str>topic) <= MAX_TOPIC_LENGTH_V1:
            return None
        if len(<bytes>body) > self._config.max_message_size or len(<bytes>props) > MAX_PROPERTIES_LENGTH:
            return None
        if may_park(<bytes>props):
            return None
        # records.is_consumable; a flag out of its 32 bits fails the encoder, which the reference declines
        if not -0x80000000 <= sys_flag <= 0x7FFFFFFF or (<int>sys_flag & 0xC) not in (0, 8):
            return None
        _replace(rec, _r_at[5], self._store_host)
        if not self._put(self._encode, rec, <str>topic, _get(rec, _r_at[4]), &a):
            return None
        result = _bare(self._put_result)
        _fill(result, self._p_at[0], self._put_ok)
        _fill(result, self._p_at[1], _append_result(&a, 1))
        _fill(result, self._p_at[2], [self._msg_id(<uint64_t>a.offset)])
        _fill(result, self._p_at[3], "")
        return result

    def put_send(self, topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host, reconsume_times,
                 cluster):
        cdef Appended a
        if not self.enabled:
            return None
        if self._compiled_prepare:
            item = prepare(topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host, reconsume_times,
                           cluster, self._store_host, self._config.max_message_size)
        else:
            item = self._prepare(topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host,
                                 reconsume_times, cluster, self._store_host, self._config.max_message_size)
        if item is None or not self._put(self._encode_send, item, topic, queue_id, &a):
            return None
        return self._msg_id(<uint64_t>a.offset), a.offset, a.n, a.queue_offset

    cdef bint _put(self, encode, item, str topic, queue_id, Appended* a) except -1:
        """The section's put of one record that advances its queue, dispatch and the listeners told; False when
        it did not go in (nothing written)."""
        if _AppendResult is None:
            _results()
        try:
            _section(self._cl, self._acquire, self._release, self._queue, self._file_size, encode, item,
                     self._key(topic, queue_id), True, 1, a)
        except (OSError, ValueError, struct.error):  # no room for a new segment, a field out of its range
            return False
        if a.status != PUT_OK:
            return False
        self._notify()
        if self.listeners:
            end = a.offset + a.n
            for listener in self.listeners:
                listener(end)
        return True

    cdef str _key(self, str topic, queue_id):
        # f"{topic}-{queue_id}", CommitLog.topic_queue_table's key, remembered per topic and queue
        if type(queue_id) is not int:
            return f"{topic}-{queue_id}"
        keys = self._keys.get(topic)
        if keys is None:
            if len(self._keys) >= 10_000:  # a bound on what many short-lived topics leave here
                self._keys.clear()
            keys = self._keys[topic] = {}
        key = (<dict>keys).get(queue_id)
        if key is None:
            if len(<dict>keys) >= 10_000:
                (<dict>keys).clear()
            key = (<dict>keys)[queue_id] = f"{topic}-{queue_id}"
        return <str>key

    cdef str _msg_id(self, uint64_t offset):
        # msgid.create_offset_msg_id: the store host's hex (fixed) and the offset's 16 upper-case hex digits
        cdef char buf[64]
        cdef Py_ssize_t n = len(self._host_hex), i
        memcpy(buf, <const char*>self._host_hex, n)
        for i in range(16):
            buf[n + 15 - i] = _HEX[offset & 0xF]
            offset >>= 4
        return PyUnicode_DecodeASCII(buf, n + 16, NULL)
