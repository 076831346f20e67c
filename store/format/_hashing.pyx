# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of :mod:`store.format.hashing` (the reference; both pass the same tests and Java vectors).

Java's ``String.hashCode`` walks UTF-16 code units with int overflow: a ``uint32_t`` loop over the code units
wraps exactly as Java's int does.
"""

from libc.stdint cimport int64_t, uint32_t

cdef extern from "Python.h":
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    int PyUnicode_1BYTE_KIND
    int PyUnicode_2BYTE_KIND


cdef uint32_t _hash_unsigned(str s) except? 0xFFFFFFFF:
    """``String.hashCode`` as an unsigned 32-bit value."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(s), i
    cdef int kind = PyUnicode_KIND(s)
    cdef uint32_t h = 0
    cdef const unsigned char* b1
    cdef const unsigned short* b2
    cdef bytes raw
    cdef const unsigned char* r
    if kind == PyUnicode_1BYTE_KIND:  # Latin-1: each character is one UTF-16 unit
        b1 = <const unsigned char*>PyUnicode_DATA(s)
        for i in range(n):
            h = 31 * h + b1[i]
        return h
    if kind == PyUnicode_2BYTE_KIND:  # the BMP, surrogates included: code units as stored
        b2 = <const unsigned short*>PyUnicode_DATA(s)
        for i in range(n):
            h = 31 * h + b2[i]
        return h
    # Beyond the BMP: encode to UTF-16 (surrogate pairs), as the reference does.
    raw = s.encode("utf-16-be", "surrogatepass")
    r = raw
    for i in range(0, len(raw), 2):
        h = 31 * h + ((<uint32_t>r[i] << 8) | r[i + 1])
    return h


def java_string_hash(str s) -> int:
    """Mirrors ``hashing.java_string_hash``."""
    cdef uint32_t h = _hash_unsigned(s)
    return <int64_t>(<int>h)


def index_key_hash(str key) -> int:
    """Mirrors ``hashing.index_key_hash``: ``Math.abs(key.hashCode())``, 0 for Integer.MIN_VALUE."""
    cdef uint32_t h = _hash_unsigned(key)
    if h == 0x80000000u:
        return 0
    if h & 0x80000000u:
        return <int64_t>0x100000000 - h
    return <int64_t>h
