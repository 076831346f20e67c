# Java's String hashing over raw record bytes, for the compiled twins (cimported; inlined into each): the tags
# code and the IndexFile key hash of store/format/hashing.py, for the ASCII strings the fast paths take.
from libc.stdint cimport int32_t, uint8_t, uint32_t


cdef inline bint _ascii(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if p[i] & 0x80:
            return False
    return True


cdef inline uint32_t _hash(uint32_t h, const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """Java ``String.hashCode`` continued over ASCII bytes (one UTF-16 unit each), wrapping as Java's int."""
    cdef Py_ssize_t i
    for i in range(n):
        h = 31 * h + p[i]
    return h


cdef inline int32_t _abs_hash(uint32_t h) noexcept nogil:
    """``hashing.index_key_hash``: Math.abs of the hash, 0 for Integer.MIN_VALUE."""
    if h == 0x80000000u:
        return 0
    if h & 0x80000000u:
        return <int32_t>(0 - h)
    return <int32_t>h
