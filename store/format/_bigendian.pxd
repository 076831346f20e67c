# Java's big-endian integer fields, read from and written into raw record bytes, for the compiled twins
# (cimported; inlined into each).  The Python twins use struct with the formats of store/format/records.py.
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t


cdef inline uint32_t _u32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline int32_t _i32(const uint8_t* p) noexcept nogil:
    return <int32_t>_u32(p)


cdef inline int64_t _i64(const uint8_t* p) noexcept nogil:
    return <int64_t>((<uint64_t>_u32(p) << 32) | _u32(p + 4))


cdef inline int16_t _i16(const uint8_t* p) noexcept nogil:
    return <int16_t>((p[0] << 8) | p[1])


cdef inline void _put32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v >> 24
    p[1] = v >> 16
    p[2] = v >> 8
    p[3] = v


cdef inline void _put64(uint8_t* p, uint64_t v) noexcept nogil:
    _put32(p, <uint32_t>(v >> 32))
    _put32(p + 4, <uint32_t>v)


# A Python int that fits Java's int / long, as the Python twins' struct.pack would accept it.
cdef inline bint _fits32(object v):
    return type(v) is int and -0x80000000 <= v <= 0x7FFFFFFF


cdef inline bint _fits64(object v):
    return type(v) is int and -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF
