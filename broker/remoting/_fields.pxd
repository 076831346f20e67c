# The header values the compiled request readers take as they are (plain decimal integers, absent or "false"
# booleans); anything else is left to the reference, which parses it as the generic header codec does. Cimported
# and inlined into each reader.
from libc.stdint cimport int64_t


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL


cdef inline object _int(object s):
    """``int(s)`` of an ASCII ``[-]digits`` string of at most 18 digits; None for anything ``int`` might read
    otherwise (spaces, '+', '_', other digits) or refuse."""
    if type(s) is not str or not s.isascii():
        return None
    cdef Py_ssize_t n, i = 0
    cdef const char* p = PyUnicode_AsUTF8AndSize(s, &n)
    cdef bint neg = n > 0 and p[0] == 45  # '-'
    cdef int64_t v = 0
    if neg:
        i = 1
    if n - i < 1 or n - i > 18:
        return None
    while i < n:
        if p[i] < 48 or p[i] > 57:
            return None
        v = v * 10 + (p[i] - 48)
        i += 1
    return -v if neg else v


cdef inline bint _false_or_absent(object v):
    return v is None or (type(v) is str and v == "false")


cdef inline tuple _v2_fields(dict ext):
    """A SEND_MESSAGE_V2 header's (topic, properties string, queueId, sysFlag, flag, bornTimestamp,
    reconsumeTimes) when every field is as the Java client writes it; None otherwise (the reference parses it)."""
    get = ext.get
    topic, props_s, j = get("b"), get("i"), get("j")
    queue_id, sys_flag, flag, born_ts = _int(get("e")), _int(get("f")), _int(get("h")), _int(get("g"))
    reconsume = 0 if j is None else _int(j)
    if (
        queue_id is None or sys_flag is None or flag is None or born_ts is None or reconsume is None
        or type(topic) is not str or type(get("a")) is not str or type(get("c")) is not str or _int(get("d")) is None
        or not (props_s is None or type(props_s) is str) or "l" in ext
        or not _false_or_absent(get("k")) or not _false_or_absent(get("m"))
    ):
        return None
    return topic, props_s, queue_id, sys_flag, flag, born_ts, reconsume
