# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of the hot functions of :mod:`store.format.records` (the reference).

Each function here mirrors the one of the same name in ``records.py`` and handles the common case: a whole,
valid record.  Anything else (a short buffer, a negative position, a record that fails a check, an integer out
of its field's range) is handed to the Python reference, so errors, reasons and results stay those of one
implementation; the differential fuzzers (``tests/fuzz``) hold both to the same answers.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from store.format._segments cimport PropertySpans, _property_spans
from store.format._crc cimport _body_crc
from store.format._bigendian cimport _fits32, _fits64, _i16, _i32, _i64, _put32, _put64, _u32
from libc.string cimport memcpy
from store.format._layout cimport BORN_V6, MAGIC_V1, MAGIC_V2, MIN_RECORD, STORE_V6
from store.format._record_writer cimport (
    Fields, _read_fields, _read_values, _record_length, _write_after_head, _write_head,
)
from store.format._slots cimport _get, _slot

from store.format import native
from store.format.delay import DEFAULT_DELAY_MILLIS, SCHEDULE_TOPIC, schedule_tags_code
from store.format.hashing import tags_code as _tags_code
from store.format.msgid import pack_ip
from store.format.records import CheckResult, DispatchRequest, MessageRecord


_fast_crc32 = native.fast_crc32()
_reference = native.TWINS["store.format.records"].python
_topic_cache = {}
_tags_code_cache = {}
cdef dict _ip_cache = {}
cdef dict _topics = {}  # topic -> its UTF-8 bytes

# MessageRecord's fields _read_record reads, in the order _read_values takes them
_RECORD_FIELDS = (
    "topic", "magic", "body", "properties", "body_crc", "sys_flag", "born_host", "store_host", "queue_id", "flag",
    "queue_offset", "physical_offset", "born_timestamp", "store_timestamp", "reconsume_times",
    "prepared_transaction_offset",
)
cdef Py_ssize_t _at[16]
for _i, _name in enumerate(_RECORD_FIELDS):
    _at[_i] = _slot(MessageRecord, _name)


cdef tuple _read_record(rec, Fields* f):
    """``_read_fields`` of a MessageRecord through its slots (its topic's bytes remembered): a single put reads
    sixteen fields, each a type look-up and a descriptor call through ``getattr``."""
    if type(rec) is not MessageRecord:
        return _read_fields(rec, f, _ip_cache, pack_ip, _fast_crc32)
    topic = _get(rec, _at[0])
    encoded = _topics.get(topic) if type(topic) is str else None
    if encoded is None:
        encoded = topic.encode("utf-8")
        if type(topic) is str:
            if len(_topics) >= 10_000:  # a bound on what many short-lived topics leave here
                _topics.clear()
            _topics[topic] = encoded
    return _read_values(
        encoded, _get(rec, _at[1]), _get(rec, _at[2]), _get(rec, _at[3]), _get(rec, _at[4]), _get(rec, _at[5]),
        _get(rec, _at[6]), _get(rec, _at[7]), _get(rec, _at[8]), _get(rec, _at[9]), _get(rec, _at[10]),
        _get(rec, _at[11]), _get(rec, _at[12]), _get(rec, _at[13]), _get(rec, _at[14]), _get(rec, _at[15]), f,
        _ip_cache, pack_ip, _fast_crc32,
    )


def encode_record(rec):
    """Mirrors ``records.encode_record``."""
    cdef Fields f
    keep = _read_record(rec, &f)
    if keep is None:
        return _reference["encode_record"](rec)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, f.total)
    cdef uint8_t* p = <uint8_t*>PyBytes_AS_STRING(out)
    _write_after_head(p, &f)
    _write_head(p, &f)
    return out


cdef class Encoder:
    """Base of the compiled encoders (declared in ``_records.pxd``); a subclass defines both entries."""

    cdef Py_ssize_t write(self, object dest, Py_ssize_t pos, Py_ssize_t limit, object item, int64_t queue_offset,
                          int64_t physical_offset, int64_t store_timestamp) except? -1:
        raise NotImplementedError


cdef class RecordEncoder(Encoder):
    """``put_record``: mirrors ``records.put_record``, the record encoded straight into ``dest``, back-filled, its
    head last."""

    def __call__(self, dest, pos, limit, rec, queue_offset, physical_offset, store_timestamp):
        if not (type(pos) is int and type(limit) is int and 0 <= pos <= 0x7FFFFFFFFFFF and limit <= 0x7FFFFFFFFFFF
                and _fits64(queue_offset) and _fits64(physical_offset) and _fits64(store_timestamp)):
            return _reference["put_record"](dest, pos, limit, rec, queue_offset, physical_offset, store_timestamp)
        return self.write(dest, pos, limit, rec, queue_offset, physical_offset, store_timestamp)

    cdef Py_ssize_t write(self, object dest, Py_ssize_t pos, Py_ssize_t limit, object rec, int64_t queue_offset,
                          int64_t physical_offset, int64_t store_timestamp) except? -1:
        cdef Fields f
        cdef Py_buffer view
        cdef uint8_t* p
        keep = _read_record(rec, &f) if pos >= 0 else None
        if keep is None:
            return _reference["put_record"](dest, pos, limit, rec, queue_offset, physical_offset, store_timestamp)
        try:
            PyObject_GetBuffer(dest, &view, PyBUF_WRITABLE)
        except (BufferError, TypeError):
            return _reference["put_record"](dest, pos, limit, rec, queue_offset, physical_offset, store_timestamp)
        try:
            if limit > view.len:
                return _reference["put_record"](dest, pos, limit, rec, queue_offset, physical_offset,
                                                store_timestamp)
            if pos + f.total > limit:
                return -f.total
            f.qoff, f.phys, f.store_ts = queue_offset, physical_offset, store_timestamp
            p = <uint8_t*>view.buf + pos
            # The GIL is kept: released for a µs, it would go to the dispatch thread for a switch interval.
            _write_after_head(p, &f)
            _write_head(p, &f)  # last: until then the segment holds zeros there, the end of the log to recovery
        finally:
            PyBuffer_Release(&view)
        return f.total


put_record = RecordEncoder()


def patch_record(buf, Py_ssize_t pos, queue_offset, physical_offset, store_timestamp):
    """Mirrors ``records.patch_record``."""
    cdef Py_buffer view
    if not (_fits64(queue_offset) and _fits64(physical_offset) and _fits64(store_timestamp)) or pos < 0:
        return _reference["patch_record"](buf, pos, queue_offset, physical_offset, store_timestamp)
    try:
        PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
    except (BufferError, TypeError):  # read-only bytes, not a buffer: the reference raises what pack_into does
        return _reference["patch_record"](buf, pos, queue_offset, physical_offset, store_timestamp)
    cdef uint8_t* p
    cdef Py_ssize_t ts_at
    try:
        if pos + 40 > view.len:
            return _reference["patch_record"](buf, pos, queue_offset, physical_offset, store_timestamp)
        p = <uint8_t*>view.buf + pos
        ts_at = 68 if p[39] & BORN_V6 else 56
        if pos + ts_at + 8 > view.len:
            return _reference["patch_record"](buf, pos, queue_offset, physical_offset, store_timestamp)
        _put64(p + 20, <uint64_t><int64_t>queue_offset)
        _put64(p + 28, <uint64_t><int64_t>physical_offset)
        _put64(p + ts_at, <uint64_t><int64_t>store_timestamp)
    finally:
        PyBuffer_Release(&view)


def check_record(buf, Py_ssize_t pos, *, check_crc=True, delay_millis=DEFAULT_DELAY_MILLIS, size=None):
    """Mirrors ``records.check_record`` for a valid record; hands every other case to it."""
    cdef Py_buffer view
    if pos < 0:
        return _reference["check_record"](buf, pos, check_crc=check_crc, delay_millis=delay_millis, size=size)
    try:
        PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    except (BufferError, TypeError):
        return _reference["check_record"](buf, pos, check_crc=check_crc, delay_millis=delay_millis, size=size)
    try:
        result = _check(<const uint8_t*>view.buf, view.len, pos, size, check_crc, buf, delay_millis)
    finally:
        PyBuffer_Release(&view)
    if result is None:
        return _reference["check_record"](buf, pos, check_crc=check_crc, delay_millis=delay_millis, size=size)
    return result


cdef object _check(const uint8_t* b, Py_ssize_t n, Py_ssize_t pos, object size, object check_crc, object buf,
                   object delay_millis):
    """The DispatchRequest's CheckResult, or None when the reference must decide."""
    cdef Py_ssize_t left = n - pos
    cdef int32_t total, magic, sys_flag, body_len, crc
    cdef Py_ssize_t born, store, hdr, p, limit, topic_len, props_len
    cdef Py_ssize_t body_at, topic_at
    cdef const uint8_t* r
    if left < 48:
        return None
    r = b + pos
    total = _i32(r)
    magic = _i32(r + 4)
    if size is None:
        if not ((magic == MAGIC_V1 or magic == MAGIC_V2) and MIN_RECORD <= total <= left):
            return None  # BLANK, zeros, bad bytes: the reference words them
    elif size < 0 or size > left or total < 0 or total > left:
        return None
    sys_flag = _i32(r + 36)
    born = 20 if sys_flag & BORN_V6 else 8
    store = 20 if sys_flag & STORE_V6 else 8
    hdr = 48 + born + 8 + store + 16
    if (size is not None and size < hdr) or hdr > left or total < hdr:
        return None
    body_len = _i32(r + hdr - 4)
    limit = total
    p = hdr
    if body_len < 0 or p + body_len > limit:
        return None
    body_at = p
    p += body_len
    if magic == MAGIC_V2:
        if p + 2 > limit:
            return None
        topic_len = _i16(r + p)
        p += 2
    else:
        if p + 1 > limit:
            return None
        topic_len = <signed char>r[p]
        p += 1
    if topic_len < 0 or p + topic_len + 2 > limit:
        return None
    topic_at = p
    p += topic_len
    props_len = _i16(r + p)
    p += 2
    if props_len < 0 or p + props_len > limit:
        return None
    if _record_length(sys_flag, body_len, topic_len, props_len, magic) != total:
        return None
    crc = _i32(r + 8)
    if check_crc and body_len > 0:
        if <int32_t>_body_crc(_fast_crc32, r + body_at, body_len) != crc:
            return None
    raw_topic = PyBytes_FromStringAndSize(<const char*>r + topic_at, topic_len)
    topic = _topic_cache.get(raw_topic)
    if topic is None:
        topic = raw_topic.decode("utf-8", "replace")
        if len(_topic_cache) > 100_000:
            _topic_cache.clear()
        _topic_cache[raw_topic] = topic
    cdef PropertySpans spans
    _property_spans(r, p, p + props_len, &spans)
    cdef Py_ssize_t tags_at = spans.tags_at, tags_len = spans.tags_len, keys_at = spans.keys_at
    cdef Py_ssize_t keys_len = spans.keys_len, uniq_at = spans.uniq_at, uniq_len = spans.uniq_len
    cdef Py_ssize_t delay_at = spans.delay_at, delay_len = spans.delay_len
    code = 0
    if tags_at >= 0:
        tags = PyBytes_FromStringAndSize(<const char*>r + tags_at, tags_len)
        known = _tags_code_cache.get(tags)
        if known is None:
            if len(_tags_code_cache) > 100_000:
                _tags_code_cache.clear()
            known = _tags_code_cache[tags] = _tags_code(tags.decode("utf-8", "replace"))
        code = known
    store_ts = _i64(r + 48 + born)
    if delay_at >= 0 and topic == SCHEDULE_TOPIC:
        code = schedule_tags_code(
            PyBytes_FromStringAndSize(<const char*>r + delay_at, delay_len), store_ts, code, delay_millis
        )
    keys = (<bytes>PyBytes_FromStringAndSize(<const char*>r + keys_at, keys_len)).decode("utf-8", "replace") \
        if keys_at >= 0 else None
    uniq = (<bytes>PyBytes_FromStringAndSize(<const char*>r + uniq_at, uniq_len)).decode("utf-8", "replace") \
        if uniq_at >= 0 else None
    return CheckResult(
        True,
        total,
        DispatchRequest(
            topic,
            _i32(r + 12),
            _i64(r + 28),
            total,
            code,
            store_ts,
            _i64(r + 20),
            keys,
            uniq,
            sys_flag,
            _i64(r + hdr - 12),
            (sys_flag & 0xC) == 0 or (sys_flag & 0xC) == 8,
        ),
    )
