# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of :mod:`store.format.transaction` (the reference): a half message's properties built in one
scan and its record encoded by the compiled run encoder; the committed record copied from the half's bytes and
patched.  Anything unusual (a cluster name holding a separator, a record whose lengths do not frame it, a topic
over 0x7FFF bytes, an integer out of its field's range) is handed to the reference, so errors and their wording
exist once; the differential fuzzers hold both to the same answers.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy
from store.format._bigendian cimport _fits32, _fits64, _i16, _i32, _put32, _put64
from store.format._record_writer cimport _unclosed
from store.format._segments cimport _last_value
from store.format._layout cimport BORN_V6, COMMIT_TYPE, MAGIC_V1, MAGIC_V2, MIN_RECORD, STORE_V6, TRANSACTION_BITS

from store.constants import TRANS_HALF_TOPIC as _HALF_TOPIC
from store.format import native
from store.format._runs import encode_message as _encode_message

_reference = native.TWINS["store.format.transaction"].python


cdef inline bytes _closed(bytes props):
    # properties.append_properties' separator before what is appended
    return props + b"\x02" if _unclosed(<const uint8_t*>PyBytes_AS_STRING(props), PyBytes_GET_SIZE(props)) else props


def encode_half(topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host, store_host,
                reconsume_times, cluster):
    """Mirrors ``transaction.encode_half``."""
    if (
        type(props) is not bytes or type(topic) is not str or type(queue_id) is not int or type(sys_flag) is not int
        or type(cluster) is not str or "\x01" in cluster or "\x02" in cluster
    ):  # a cluster holding a separator would add segments of its own: the reference reads them
        return _reference["encode_half"](topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host,
                                         store_host, reconsume_times, cluster)
    cdef Py_ssize_t value_len
    cdef bytes sent = props
    if _last_value(<const uint8_t*>PyBytes_AS_STRING(sent), PyBytes_GET_SIZE(sent), b"CLUSTER\x01", 8,
                   &value_len) < 0:
        sent = _closed(sent) + b"CLUSTER\x01" + cluster.encode("utf-8") + b"\x02"
    cdef Py_ssize_t at = _last_value(<const uint8_t*>PyBytes_AS_STRING(sent), PyBytes_GET_SIZE(sent), b"UNIQ_KEY\x01",
                                     9, &value_len)
    uniq = None
    cdef bytes extra = b""
    if at >= 0:
        uniq = PyBytes_FromStringAndSize(PyBytes_AS_STRING(sent) + at, value_len).decode("utf-8", "replace")
        extra = b"__transactionId__\x01" + uniq.encode("utf-8") + b"\x02"
    extra = extra + b"REAL_TOPIC\x01" + topic.encode("utf-8") + b"\x02REAL_QID\x01" + str(queue_id).encode() + b"\x02"
    cdef bytes half_props = _closed(sent) + extra
    run = _encode_message(_HALF_TOPIC, 0, body, half_props, flag, sys_flag & ~TRANSACTION_BITS, born_timestamp,
                          born_host, store_host, reconsume_times, cluster)
    return run, uniq, half_props


def commit_record(half, topic, queue_id, half_offset):
    """Mirrors ``transaction.commit_record``."""
    if type(half) is not bytes or type(topic) is not str or not _fits32(queue_id) or not _fits64(half_offset):
        return _reference["commit_record"](half, topic, queue_id, half_offset)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(half)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(half)
    if n < MIN_RECORD:
        return _reference["commit_record"](half, topic, queue_id, half_offset)
    cdef int32_t total = _i32(p), magic = _i32(p + 4), sys_flag = _i32(p + 36)
    # the header: 48 fixed bytes, born host, store time, store host, reconsume times, prepared offset, body length
    cdef Py_ssize_t header = 48 + (20 if sys_flag & BORN_V6 else 8) + 8 + (20 if sys_flag & STORE_V6 else 8) + 16
    cdef bint wide = magic == MAGIC_V2
    if total < header or total > n or (magic != MAGIC_V1 and not wide):
        return _reference["commit_record"](half, topic, queue_id, half_offset)
    cdef Py_ssize_t topic_field = header + <Py_ssize_t>_i32(p + header - 4), topic_len, props_field, props_len
    if topic_field < header or topic_field + (2 if wide else 1) > total:
        return _reference["commit_record"](half, topic, queue_id, half_offset)
    if wide:
        topic_len, props_field = _i16(p + topic_field), topic_field + 2
    else:
        topic_len, props_field = <signed char>p[topic_field], topic_field + 1
    props_field += topic_len
    if topic_len < 0 or props_field + 2 > total:
        return _reference["commit_record"](half, topic, queue_id, half_offset)
    props_len = _i16(p + props_field)
    if props_len < 0 or props_field + 2 + props_len > total:
        return _reference["commit_record"](half, topic, queue_id, half_offset)
    cdef bytes t = topic.encode("utf-8")
    cdef Py_ssize_t t_len = len(t)
    if t_len > 0x7FFF:
        return _reference["commit_record"](half, topic, queue_id, half_offset)  # RecordEncodeError
    cdef bint out_wide = t_len > 127
    cdef Py_ssize_t t_field = 2 if out_wide else 1
    cdef Py_ssize_t size = topic_field + t_field + t_len + 2 + props_len
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    memcpy(o, p, topic_field)
    _put32(o, <uint32_t>size)
    _put32(o + 4, <uint32_t>(MAGIC_V2 if out_wide else MAGIC_V1))
    _put32(o + 12, <uint32_t><int32_t>queue_id)
    _put32(o + 36, <uint32_t>((sys_flag & ~TRANSACTION_BITS) | COMMIT_TYPE))
    _put64(o + header - 12, <uint64_t><int64_t>half_offset)
    cdef Py_ssize_t q = topic_field
    if out_wide:
        o[q], o[q + 1] = (t_len >> 8) & 0xFF, t_len & 0xFF
    else:
        o[q] = t_len
    q += t_field
    memcpy(o + q, PyBytes_AS_STRING(t), t_len)
    q += t_len
    o[q], o[q + 1] = (props_len >> 8) & 0xFF, props_len & 0xFF
    memcpy(o + q + 2, p + props_field + 2, props_len)
    return out
