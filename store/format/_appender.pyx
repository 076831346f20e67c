# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of :class:`store.format.appender.Appender` (the reference; its docstring says what a put does and
which puts it declines).

One put (``put`` of a MessageRecord, ``put_send`` of a send header's fields) is this one call.  Between taking the
put lock and releasing it no Python code runs and nothing the collector tracks is allocated, so the GIL is held
throughout: no other thread sees a half-made record, and the TOTALSIZE and MAGIC are written last as
``put_record`` writes them (until then the segment holds zeros there, the end of the log to recovery).
"""

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcmp, memcpy
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec
from store.format._crc cimport FAST_CRC_FROM
from store.format._record_writer cimport Fields, _has_cluster, _read_values, _unclosed, _write_after_head, _write_head

from store.format import native
from store.format.delay import PARK_MARKERS
from store.format.msgid import create_offset_msg_id, pack_ip
from store.format.records import END_FILE_MIN_BLANK_LENGTH, MAX_PROPERTIES_LENGTH, MessageRecord


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    int T_OBJECT_EX
    int READONLY


_fast_crc32 = native.fast_crc32()
cdef dict _ip_cache = {}
cdef bytes _DELAY = PARK_MARKERS[0]
cdef bytes _TIMER = PARK_MARKERS[1]
assert len(_DELAY) == len(_TIMER) == 6
cdef const char* _DELAY_AT = _DELAY
cdef const char* _TIMER_AT = _TIMER
cdef tuple _NO_ARGS = ()
cdef const char* _HEX = b"0123456789ABCDEF"


cdef inline bint _consumable(object sys_flag):
    """A sys flag in its 32-bit range that is not a half or rollback message (``records.is_consumable``)."""
    return -0x80000000 <= sys_flag <= 0x7FFFFFFF and (sys_flag & 0xC) in (0, 8)


cdef inline bint _may_park(bytes props):
    # delay.may_park in one pass: b"DELAY\x01" or b"TIMER_" anywhere in it
    cdef const char* p = PyBytes_AS_STRING(props)
    cdef Py_ssize_t i, n = PyBytes_GET_SIZE(props) - 5
    for i in range(n):
        if p[i] == b'D' and memcmp(p + i, _DELAY_AT, 6) == 0:
            return True
        if p[i] == b'T' and memcmp(p + i, _TIMER_AT, 6) == 0:
            return True
    return False


cdef inline object _bare(object cls):
    """An instance of a slots dataclass, its fields unset: the caller fills each (:func:`_fill`); ``__init__``
    and a ``setattr`` per field would cost more than the rest of the put's result."""
    return (<PyTypeObject*>cls).tp_new(cls, <PyObject*>_NO_ARGS, NULL)


cdef inline void _fill(object obj, Py_ssize_t offset, object value):
    # a slot of an object fresh from _bare (NULL until now): the reference moves into it
    Py_INCREF(value)
    (<PyObject**>((<char*><PyObject*>obj) + offset))[0] = <PyObject*>value


cdef Py_ssize_t _slot(object cls, str name) except -1:
    """Where an instance of ``cls`` holds field ``name``: a writable object slot (``dataclass(slots=True)``)."""
    descr = cls.__dict__.get(name)
    if type(descr).__name__ != "member_descriptor":
        raise TypeError(f"{cls.__name__}.{name} is not a slot")
    cdef PyMemberDef* member = (<PyMemberDescrObject*><PyObject*>descr).d_member
    if member.type != T_OBJECT_EX or member.flags & READONLY:
        raise TypeError(f"{cls.__name__}.{name} is not a writable object slot")
    return member.offset


cdef inline object _get(object obj, Py_ssize_t offset):
    # a slot's value, as its member descriptor reads it (``type(obj)`` checked by the caller)
    cdef PyObject* value = (<PyObject**>((<char*><PyObject*>obj) + offset))[0]
    if value == NULL:
        raise AttributeError(f"{type(obj).__name__} has a field unset")
    return <object>value


cdef inline void _replace(object obj, Py_ssize_t offset, object value):
    cdef PyObject** at = <PyObject**>((<char*><PyObject*>obj) + offset)
    cdef PyObject* old = at[0]
    Py_INCREF(value)
    at[0] = <PyObject*>value
    Py_XDECREF(old)


# MessageRecord's fields this reads, in the order _read_values takes them
_RECORD_FIELDS = (
    "topic", "magic", "body", "properties", "body_crc", "sys_flag", "born_host", "store_host", "queue_id", "flag",
    "queue_offset", "physical_offset", "born_timestamp", "store_timestamp", "reconsume_times",
    "prepared_transaction_offset",
)
cdef Py_ssize_t _r_at[16]
for _i, _name in enumerate(_RECORD_FIELDS):
    _r_at[_i] = _slot(MessageRecord, _name)
_APPEND_FIELDS = ("status", "wrote_offset", "wrote_bytes", "store_timestamp", "queue_offset", "msg_num")
_PUT_FIELDS = ("status", "append", "msg_ids", "error")


cdef class Appender:
    """Mirrors ``appender.Appender``."""

    cdef public bint enabled, sends_enabled
    cdef public object listeners
    cdef dict _topics
    cdef str _cluster  # the cluster put_send saw last, its CLUSTER property and whether that may_park
    cdef bytes _extra
    cdef bint _extra_parks
    cdef object _commitlog, _queue, _config, _store_host, _notify, _acquire, _release
    cdef object _put_result, _append_result, _put_ok, _append_ok
    cdef bytes _host_hex
    cdef Py_ssize_t _a_at[6]
    cdef Py_ssize_t _p_at[4]

    def __init__(self, commitlog, config, store_host, notify, put_result, append_result, put_ok, append_ok):
        self._commitlog = commitlog
        self._queue = commitlog.queue
        self._topics = {}  # topic -> (its UTF-8 bytes, {queue id: its key in the table})
        self._acquire = commitlog.put_lock.acquire
        self._release = commitlog.put_lock.release
        self._config = config
        self._store_host = store_host
        self._notify = notify
        self._put_result, self._append_result = put_result, append_result
        self._put_ok, self._append_ok = put_ok, append_ok
        for i, name in enumerate(_APPEND_FIELDS):
            self._a_at[i] = _slot(append_result, name)
        for i, name in enumerate(_PUT_FIELDS):
            self._p_at[i] = _slot(put_result, name)
        zero = create_offset_msg_id(store_host, 0)
        self._host_hex = zero[: len(zero) - 16].encode("ascii")
        self.enabled = False
        self.sends_enabled = False
        self.listeners = []
        self._cluster, self._extra, self._extra_parks = None, b"", False

    def put(self, rec):
        # A MessageRecord's fields are read from its slots: what its member descriptors do, without a look-up each
        if not self.enabled or type(rec) is not MessageRecord:
            return None
        _replace(rec, _r_at[7], self._store_host)
        topic, magic, body, props, crc, sys_flag = (
            _get(rec, _r_at[0]), _get(rec, _r_at[1]), _get(rec, _r_at[2]), _get(rec, _r_at[3]), _get(rec, _r_at[4]),
            _get(rec, _r_at[5]),
        )
        if type(props) is not bytes or type(body) is not bytes or type(topic) is not str or not topic:
            return None
        if len(body) > self._config.max_message_size or len(props) > MAX_PROPERTIES_LENGTH:
            return None
        if _may_park(props):
            return None
        if magic is not None or crc is not None or type(sys_flag) is not int:
            return None
        if not _consumable(sys_flag):
            return None
        cdef Fields f
        queue_id = _get(rec, _r_at[8])
        if type(queue_id) is not int:
            return None
        known, key = self._key(topic, queue_id)
        if _fast_crc32 is not None and len(body) >= FAST_CRC_FROM:
            crc = _fast_crc32(body) & 0x7FFFFFFF  # _body_crc's, without a memoryview of the body
        keep = _read_values(
            (<tuple>known)[0], magic, body, props, crc, sys_flag, _get(rec, _r_at[6]), self._store_host, queue_id,
            _get(rec, _r_at[9]), _get(rec, _r_at[10]), _get(rec, _r_at[11]), _get(rec, _r_at[12]),
            _get(rec, _r_at[13]), _get(rec, _r_at[14]), _get(rec, _r_at[15]), &f, _ip_cache, pack_ip, _fast_crc32,
        )
        if keep is None or not self._write(key, &f):
            return None
        append = _bare(self._append_result)
        _fill(append, self._a_at[0], self._append_ok)
        _fill(append, self._a_at[1], f.phys)
        _fill(append, self._a_at[2], f.total)
        _fill(append, self._a_at[3], f.store_ts)
        _fill(append, self._a_at[4], f.qoff)
        _fill(append, self._a_at[5], 1)
        result = _bare(self._put_result)
        _fill(result, self._p_at[0], self._put_ok)
        _fill(result, self._p_at[1], append)
        _fill(result, self._p_at[2], [self._msg_id(<uint64_t>f.phys)])
        _fill(result, self._p_at[3], "")
        return result

    def put_send(self, topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host, reconsume_times,
                 cluster):
        # The record's properties are the client's bytes then, unless they hold a CLUSTER, the broker's: written
        # one after the other (Fields.extra), never joined into a new bytes
        if not self.sends_enabled or not (
            type(topic) is str and type(queue_id) is int and type(body) is bytes and type(props) is bytes
            and type(flag) is int and type(sys_flag) is int and type(born_timestamp) is int
            and type(born_host) is tuple and len(<tuple>born_host) == 2 and type(born_host[0]) is str
            and type(born_host[1]) is int and type(reconsume_times) is int and type(cluster) is str
        ):
            return None
        cdef const uint8_t* pp = <const uint8_t*>PyBytes_AS_STRING(props)
        cdef Py_ssize_t props_len = PyBytes_GET_SIZE(props)
        cdef bint add = not _has_cluster(pp, props_len)
        if add and cluster is not self._cluster and cluster != self._cluster:
            try:  # properties.append_properties', with its leading separator (written after unclosed properties)
                extra = ("\x02CLUSTER\x01" + <str>cluster + "\x02").encode("utf-8")
            except ValueError:
                return None
            self._cluster, self._extra, self._extra_parks = cluster, extra, _may_park(extra)
        cdef Py_ssize_t extra_len = PyBytes_GET_SIZE(self._extra) - 1 + _unclosed(pp, props_len) if add else 0
        if not topic or len(body) > self._config.max_message_size:
            return None
        if PyBytes_GET_SIZE(props) + extra_len > MAX_PROPERTIES_LENGTH:
            return None
        # may_park of the joined properties: no marker can straddle the join, the CLUSTER property opening with a
        # 'C' that neither marker holds
        if _may_park(props) or (add and self._extra_parks):
            return None
        if not _consumable(sys_flag):
            return None
        cdef Fields f
        try:
            known, key = self._key(topic, queue_id)
            keep = _read_values(
                (<tuple>known)[0], None, body, props, None, sys_flag, born_host, self._store_host, queue_id, flag, 0,
                0, born_timestamp, 0, reconsume_times, 0, &f, _ip_cache, pack_ip, _fast_crc32,
            )
        except ValueError:  # a topic or an address that cannot be encoded: the reference declines it too
            return None
        if keep is None:
            return None
        f.extra = <const uint8_t*>PyBytes_AS_STRING(self._extra) + PyBytes_GET_SIZE(self._extra) - extra_len
        f.extra_len = extra_len
        f.total += extra_len
        if not self._write(key, &f):
            return None
        return self._msg_id(<uint64_t>f.phys), f.phys, f.total, f.qoff

    cdef tuple _key(self, str topic, object queue_id):
        """(the topic's UTF-8 bytes and its queues' keys, the queue's key in CommitLog.topic_queue_table)."""
        known = self._topics.get(topic)
        if known is None:
            if len(self._topics) >= 10_000:  # a bound on what many short-lived topics leave here
                self._topics.clear()
            known = self._topics[topic] = (topic.encode("utf-8"), {})
        keys = (<tuple>known)[1]
        key = (<dict>keys).get(queue_id)
        if key is None:
            if len(<dict>keys) >= 10_000:
                (<dict>keys).clear()
            key = keys[queue_id] = f"{topic}-{queue_id}"  # CommitLog.topic_queue_table's key
        return known, key

    cdef bint _write(self, object key, Fields* f) except -1:
        """``f`` written at the end of the newest segment, its queue offset, physical offset and store time filled
        in, dispatch and the listeners told; False, nothing written, when the log takes no put or has no room."""
        cdef Py_buffer view
        cdef Py_ssize_t start, limit
        cdef int64_t base, store_ts
        cdef timespec now
        cdef uint8_t* p
        cl = self._commitlog
        self._acquire()
        try:
            files = self._queue.files
            table = cl.topic_queue_table  # recovery and the tests may replace the table: read under the lock
            if not cl.writable or not files or type(table) is not dict:
                return False
            mf = files[len(files) - 1]
            start = mf.wrote
            base = mf.file_from_offset
            limit = mf.file_size - END_FILE_MIN_BLANK_LENGTH
            PyObject_GetBuffer(mf.view, &view, PyBUF_WRITABLE)
            try:
                if limit > view.len or start < 0 or start + f.total > limit:
                    return False  # no room: the general path writes the BLANK and rolls
                clock_gettime(CLOCK_REALTIME, &now)
                store_ts = <int64_t>now.tv_sec * 1000 + now.tv_nsec // 1000000
                queue_offset = (<dict>table).get(key, 0)
                f.qoff = queue_offset
                f.phys = base + start
                f.store_ts = store_ts
                p = <uint8_t*>view.buf + start
                _write_after_head(p, f)
                _write_head(p, f)  # last: until then the segment holds zeros there
            finally:
                PyBuffer_Release(&view)
            mf.wrote = start + f.total
            ts = store_ts
            mf.last_store_timestamp = ts
            cl.last_store_timestamp = ts
            (<dict>table)[key] = queue_offset + 1
        finally:
            self._release()
        self._notify()
        end = base + start + f.total
        for listener in self.listeners:
            listener(end)
        return True

    cdef str _msg_id(self, uint64_t offset):
        # msgid.create_offset_msg_id: the store host's hex (fixed) and the offset's 16 upper-case hex digits
        cdef char buf[64]
        cdef Py_ssize_t n = PyBytes_GET_SIZE(self._host_hex), i
        memcpy(buf, PyBytes_AS_STRING(self._host_hex), n)
        for i in range(16):
            buf[n + 15 - i] = _HEX[offset & 0xF]
            offset >>= 4
        return PyUnicode_DecodeASCII(buf, n + 16, NULL)
