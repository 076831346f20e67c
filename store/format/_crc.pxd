# The 31-bit BODYCRC of a record (``hashing.body_crc32``) for the compiled twins (cimported; inlined into each):
# ISA-L's folding CRC (``native.fast_crc32``) for bodies long enough to pay for its Python call, else zlib's.
from cpython.buffer cimport PyBUF_READ
from cpython.memoryview cimport PyMemoryView_FromMemory
from libc.stdint cimport uint8_t, uint32_t


cdef extern from "zlib.h" nogil:
    unsigned long crc32(unsigned long crc, const unsigned char* buf, unsigned int len)


cdef enum:
    FAST_CRC_FROM = 256  # body bytes from which ISA-L's CRC, a Python call, is the faster


cdef inline uint32_t _body_crc(object fast, const uint8_t* p, Py_ssize_t n):
    if fast is not None and n >= FAST_CRC_FROM:
        return <uint32_t>(fast(PyMemoryView_FromMemory(<char*>p, n, PyBUF_READ)) & 0x7FFFFFFF)
    return <uint32_t>(crc32(0, p, <unsigned int>n) & 0x7FFFFFFF)
