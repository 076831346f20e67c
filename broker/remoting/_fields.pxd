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
