# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``store.format.appender`` (the reference; its docstring says which sends
:func:`prepare_send` declines).

:func:`prepare_send` reads a send's fields once into a C struct (the record's layout, its CRC, the broker's
CLUSTER property written after the client's properties, never joined into a new ``bytes``), held by a
:class:`Prepared`; :func:`put_prepared`, ``CommitLog.put``'s encoder, writes it at the segment's end with the GIL
held throughout, its TOTALSIZE and MAGIC last (until then the segment holds zeros there, the end of the log to
recovery).
"""

cimport cython
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcmp
from store.format._bigendian cimport _fits64
from store.format._record_writer cimport Fields, _has_cluster, _read_values, _unclosed, _write_after_head, _write_head
from store.format._records cimport Encoder

import struct

from store.format import native
from store.format.delay import PARK_MARKERS
from store.format.msgid import pack_ip
from store.format import records
from store.format.records import MAX_PROPERTIES_LENGTH


_fast_crc32 = native.fast_crc32()
cdef dict _ip_cache = {}
cdef dict _topics = {}  # topic -> its UTF-8 bytes
cdef dict _clusters = {}  # cluster name -> (its CLUSTER property with separators, whether that may_park)
cdef object _last_cluster = None  # the cluster name prepare saw last (a broker sends one) and its entry
cdef object _last_known = None
cdef bytes _DELAY = PARK_MARKERS[0]
cdef bytes _TIMER = PARK_MARKERS[1]
assert len(_DELAY) == len(_TIMER) == 6
cdef const char* _DELAY_AT = _DELAY
cdef const char* _TIMER_AT = _TIMER


cdef inline bint _consumable(object sys_flag):
    """A sys flag in its 32-bit range that is not a half or rollback message (``records.is_consumable``)."""
    return -0x80000000 <= sys_flag <= 0x7FFFFFFF and (sys_flag & 0xC) in (0, 8)


cdef bint may_park(bytes props):
    """``delay.may_park`` in one pass: b"DELAY\x01" or b"TIMER_" anywhere in ``props``."""
    cdef const char* p = PyBytes_AS_STRING(props)
    cdef Py_ssize_t i, n = PyBytes_GET_SIZE(props) - 5
    for i in range(n):
        if p[i] == b'D' and memcmp(p + i, _DELAY_AT, 6) == 0:
            return True
        if p[i] == b'T' and memcmp(p + i, _TIMER_AT, 6) == 0:
            return True
    return False


@cython.freelist(8)
cdef class Prepared:
    """A send's record read into ``f``; ``keep`` holds the objects ``f`` points into (declared in the .pxd)."""


cdef inline bytes _topic_bytes(str topic):
    b = _topics.get(topic)
    if b is None:
        if len(_topics) >= 10_000:  # a bound on what many short-lived topics leave here
            _topics.clear()
        b = _topics[topic] = topic.encode("utf-8")
    return <bytes>b


def prepare_send(topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host, reconsume_times,
                 cluster, store_host, max_body):
    """Mirrors ``appender.prepare_send``: a :class:`Prepared`, or None to decline."""
    return prepare(topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host, reconsume_times, cluster,
                   store_host, max_body)


cdef object prepare(object topic, object queue_id, object body, object props, object flag, object sys_flag,
                    object born_timestamp, object born_host, object reconsume_times, object cluster,
                    object store_host, object max_body):
    """:func:`prepare_send`, called straight by ``FastPut``'s compiled twin."""
    global _last_cluster, _last_known
    if not (
        type(topic) is str and type(queue_id) is int and type(body) is bytes and type(props) is bytes
        and type(flag) is int and type(sys_flag) is int and type(born_timestamp) is int
        and type(born_host) is tuple and len(<tuple>born_host) == 2 and type(born_host[0]) is str
        and type(born_host[1]) is int and type(reconsume_times) is int and type(cluster) is str
    ):
        return None
    cdef const uint8_t* pp = <const uint8_t*>PyBytes_AS_STRING(props)
    cdef Py_ssize_t props_len = PyBytes_GET_SIZE(props)
    cdef bint add = not _has_cluster(pp, props_len)
    cdef Py_ssize_t extra_len = 0
    extra, extra_parks = b"", False
    if add:
        known = _last_known if cluster is _last_cluster else _clusters.get(cluster)
        if known is None:
            try:  # properties.append_properties', with its leading separator (written after unclosed properties)
                made = ("\x02CLUSTER\x01" + <str>cluster + "\x02").encode("utf-8")
            except ValueError:
                return None
            if len(_clusters) >= 64:
                _clusters.clear()
            known = _clusters[cluster] = (made, may_park(made))
        _last_cluster, _last_known = cluster, known
        extra, extra_parks = known
        extra_len = PyBytes_GET_SIZE(extra) - 1 + _unclosed(pp, props_len)
    if not topic or len(body) > max_body:
        return None
    if props_len + extra_len > MAX_PROPERTIES_LENGTH:
        return None
    # may_park of the joined properties: no marker can straddle the join, the CLUSTER property opening with a
    # 'C' that neither marker holds
    if may_park(props) or (add and extra_parks):
        return None
    if not _consumable(sys_flag):
        return None
    cdef Prepared item = Prepared.__new__(Prepared)
    try:
        keep = _read_values(
            _topic_bytes(topic), None, body, props, None, sys_flag, born_host, store_host, queue_id, flag, 0, 0,
            born_timestamp, 0, reconsume_times, 0, &item.f, _ip_cache, pack_ip, _fast_crc32,
        )
    except ValueError:  # a topic or an address that cannot be encoded: the reference declines it too
        return None
    if keep is None:
        return None
    item.keep = keep
    item.extra = extra
    item.f.extra = <const uint8_t*>PyBytes_AS_STRING(extra) + PyBytes_GET_SIZE(extra) - extra_len
    item.f.extra_len = extra_len
    item.f.total += extra_len
    return item


cdef class PreparedEncoder(Encoder):
    """``put_prepared``: mirrors ``appender.put_prepared`` for a :class:`Prepared`, and is ``records.put_record``
    for any other item."""

    def __call__(self, dest, pos, limit, item, queue_offset, physical_offset, store_timestamp):
        if type(item) is not Prepared:
            return records.put_record(dest, pos, limit, item, queue_offset, physical_offset, store_timestamp)
        if not (type(pos) is int and type(limit) is int and pos <= 0x7FFFFFFFFFFF and limit <= 0x7FFFFFFFFFFF
                and _fits64(queue_offset) and _fits64(physical_offset) and _fits64(store_timestamp)):
            raise struct.error(f"a record at {pos} up to {limit}: a value out of its field's range")
        return self.write(dest, pos, limit, item, queue_offset, physical_offset, store_timestamp)

    cdef Py_ssize_t write(self, object dest, Py_ssize_t pos, Py_ssize_t limit, object item, int64_t queue_offset,
                          int64_t physical_offset, int64_t store_timestamp) except? -1:
        cdef Py_buffer view
        cdef uint8_t* p
        if type(item) is not Prepared:
            return records.put_record(dest, pos, limit, item, queue_offset, physical_offset, store_timestamp)
        cdef Prepared prepared = <Prepared>item
        PyObject_GetBuffer(dest, &view, PyBUF_WRITABLE)
        try:
            if pos < 0 or limit > view.len:  # the reference's words
                raise records.RecordEncodeError(
                    f"a record at {pos} up to {limit} does not fit a buffer of {view.len} bytes")
            if pos + prepared.f.total > limit:
                return -prepared.f.total
            prepared.f.qoff = queue_offset
            prepared.f.phys = physical_offset
            prepared.f.store_ts = store_timestamp
            p = <uint8_t*>view.buf + pos
            # The GIL is kept: released for a µs, it would go to the dispatch thread for a switch interval.
            _write_after_head(p, &prepared.f)
            _write_head(p, &prepared.f)  # last: until then the segment holds zeros there
        finally:
            PyBuffer_Release(&view)
        return prepared.f.total


put_prepared = PreparedEncoder()
