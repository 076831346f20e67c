# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of :mod:`broker.remoting.send_codec` (the reference).  ``read_send_v2`` reads the header the
Java client writes for a message or a half message (plain decimal integers, no unit mode, no batch flag) and
``send_reply`` writes a JSON reply whose strings need no escaping; anything else is handed to the reference."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcmp, memcpy
from broker.remoting._fields cimport _v2_fields
from store.format._segments cimport _last_value
from store.format._layout cimport TRANSACTION_BITS

from broker.remoting.codes import CURRENT_VERSION
from store.format import native
from store.schedule import may_park


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL


_reference = native.TWINS["broker.remoting.send_codec"].python
cdef bytes _VERSION = str(int(CURRENT_VERSION)).encode()


cdef object _uniq_key(const uint8_t* p, Py_ssize_t n):
    """``properties.property_value(props, "UNIQ_KEY")``: the last segment opening with UNIQ_KEY 0x01."""
    cdef Py_ssize_t v_len, v_at = _last_value(p, n, b"UNIQ_KEY\x01", 9, &v_len)
    if v_at < 0:
        return None
    return PyBytes_FromStringAndSize(<const char*>p + v_at, v_len).decode("utf-8", "replace")


def read_send_v2(ext):
    """Mirrors ``send_codec.read_send_v2``."""
    if type(ext) is not dict:
        return _reference["read_send_v2"](ext)
    if "topic" in ext or "batch" in ext or "b" not in ext:
        return None
    fields = _v2_fields(ext)
    if fields is None:
        return _reference["read_send_v2"](ext)  # an unusual header: the reference parses it or returns None
    topic, props_s, queue_id, sys_flag, flag, born_ts, reconsume = fields
    if queue_id < 0:
        return None
    cdef bytes props
    try:
        props = b"" if props_s is None else props_s.encode("utf-8")
    except UnicodeEncodeError:
        return None
    cdef Py_ssize_t n = len(props), value_len
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(props)
    if (n and p[n - 1] != 2) or may_park(props):
        return None
    cdef Py_ssize_t at = _last_value(p, n, b"TRAN_MSG\x01", 9, &value_len)
    cdef bint half = at >= 0 and value_len == 4 and memcmp(p + at, b"true", 4) == 0
    if not half and (sys_flag & TRANSACTION_BITS or b"TRAN_MSG\x01" in props):
        return None
    return topic, queue_id, sys_flag, flag, born_ts, props, reconsume, _uniq_key(p, n), half


cdef bint _plain(object s):
    """A str that JSON writes as it is: printable ASCII without '"' or '\\'."""
    if type(s) is not str or not s.isascii():  # an ASCII str's UTF-8 is its own data: no encoding, no error
        return False
    cdef Py_ssize_t n, i
    cdef const char* p = PyUnicode_AsUTF8AndSize(s, &n)
    for i in range(n):
        if p[i] < 32 or p[i] > 126 or p[i] == 34 or p[i] == 92:
            return False
    return True


def send_reply(opaque, serialize_type, msg_id, queue_id, queue_offset, transaction_id, region, trace_on):
    """Mirrors ``send_codec.send_reply`` for a JSON reply of plain strings."""
    if not (
        serialize_type == 0 and type(opaque) is int and type(queue_id) is int and type(queue_offset) is int
        and _plain(msg_id) and _plain(region) and (transaction_id is None or _plain(transaction_id))
        and type(trace_on) is bool
    ):
        return _reference["send_reply"](opaque, serialize_type, msg_id, queue_id, queue_offset, transaction_id,
                                        region, trace_on)
    tx = "" if transaction_id is None else f',"transactionId":"{transaction_id}"'
    cdef bytes header = (
        f'{{"code":0,"extFields":{{"msgId":"{msg_id}","queueId":"{queue_id}","queueOffset":"{queue_offset}"{tx},'
        f'"MSG_REGION":"{region}","TRACE_ON":"{"true" if trace_on else "false"}"}},"flag":1,"language":"PYTHON",'
        f'"opaque":{opaque},"serializeTypeCurrentRPC":"JSON","version":'
    ).encode("ascii") + _VERSION + b"}"
    cdef Py_ssize_t h = len(header)
    if h > 0xFFFFFF:  # the reference raises FrameError
        return _reference["send_reply"](opaque, serialize_type, msg_id, queue_id, queue_offset, transaction_id,
                                        region, trace_on)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, h + 8)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    cdef Py_ssize_t length = h + 4
    o[0], o[1], o[2], o[3] = (length >> 24) & 0xFF, (length >> 16) & 0xFF, (length >> 8) & 0xFF, length & 0xFF
    o[4], o[5], o[6], o[7] = 0, (h >> 16) & 0xFF, (h >> 8) & 0xFF, h & 0xFF
    memcpy(o + 8, PyBytes_AS_STRING(header), h)
    return out
