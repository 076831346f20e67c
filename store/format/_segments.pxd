# The scan of a properties string (``name 0x01 value 0x02`` segments, store/format/properties.py) that three
# compiled twins make over raw record bytes; cimported and inlined into each.
from libc.stdint cimport uint8_t


cdef inline Py_ssize_t _segment_end(const uint8_t* r, Py_ssize_t q, Py_ssize_t e) noexcept nogil:
    # the 0x02 that ends the segment starting at q, or e
    while q < e and r[q] != 2:
        q += 1
    return q


cdef inline Py_ssize_t _name_length(const uint8_t* r, Py_ssize_t seg, Py_ssize_t end) noexcept nogil:
    # bytes before the segment's 0x01 (the whole segment when it has none)
    cdef Py_ssize_t n = 0
    while seg + n < end and r[seg + n] != 1:
        n += 1
    return n
