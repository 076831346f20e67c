# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of :mod:`broker.remoting.tx_codec` (the reference).  ``read_half_v2`` reads the header the Java
client writes for a half message (plain decimal integers, no unit mode, no batch flag), ``read_end_transaction``
an END_TRANSACTION header of plain decimal integers; anything else is handed to the reference."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t
from libc.string cimport memcmp
from broker.remoting._fields cimport _int, _v2_fields
from store.format._segments cimport _last_value

from store.format import native
from store.schedule import may_park

_reference = native.TWINS["broker.remoting.tx_codec"].python


def read_half_v2(ext):
    """Mirrors ``tx_codec.read_half_v2``."""
    if type(ext) is not dict:
        return _reference["read_half_v2"](ext)
    if "topic" in ext or "batch" in ext:
        return None
    fields = _v2_fields(ext)
    if fields is None:
        return _reference["read_half_v2"](ext)  # an unusual header: the reference parses it or returns None
    topic, props_s, queue_id, sys_flag, flag, born_ts, reconsume = fields
    if queue_id < 0:
        return None
    cdef bytes props
    try:
        props = b"" if props_s is None else props_s.encode("utf-8")
    except UnicodeEncodeError:
        return None
    cdef Py_ssize_t n = PyBytes_GET_SIZE(props), value_len
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(props)
    if (n and p[n - 1] != 2) or may_park(props):
        return None
    cdef Py_ssize_t at = _last_value(p, n, b"TRAN_MSG\x01", 9, &value_len)
    if at < 0 or value_len != 4 or memcmp(p + at, b"true", 4) != 0:
        return None
    return topic, queue_id, sys_flag, flag, born_ts, props, reconsume


def read_end_transaction(ext):
    """Mirrors ``tx_codec.read_end_transaction``."""
    if type(ext) is not dict:
        return _reference["read_end_transaction"](ext)
    get = ext.get
    group, msg_id, check = get("producerGroup"), get("msgId"), get("fromTransactionCheck")
    queue_offset, clog_offset, kind = _int(get("tranStateTableOffset")), _int(get("commitLogOffset")), \
        _int(get("commitOrRollback"))
    if (
        type(group) is not str or type(msg_id) is not str or queue_offset is None or clog_offset is None
        or kind is None or not (check is None or type(check) is str)
    ):
        return _reference["read_end_transaction"](ext)
    return group, queue_offset, clog_offset, kind, check is not None and check.lower() == "true", msg_id
