# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of :func:`store.format.units.put_index_entry` (the reference), the IndexFile write of every
indexed key on the dispatch path.  Anything but an in-range entry in a writable buffer goes to the reference."""

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from store.format._bigendian cimport _fits32, _put32

from store.format import native

_reference = native.TWINS["store.format.units"].python

cdef Py_ssize_t HEADER = 40
cdef Py_ssize_t SLOT = 4
cdef Py_ssize_t ENTRY = 20


def put_index_entry(buf, hash_slot_num, entry_no, key_hash, phy_offset, time_diff):
    """Mirrors ``units.put_index_entry``."""
    cdef Py_buffer view
    cdef Py_ssize_t slot_at, entry_at
    cdef int32_t prev
    cdef uint8_t* b
    if not (
        _fits32(hash_slot_num) and hash_slot_num > 0 and _fits32(entry_no) and entry_no >= 0
        and _fits32(key_hash) and key_hash >= 0 and _fits32(time_diff)
        and type(phy_offset) is int and -0x8000000000000000 <= phy_offset <= 0x7FFFFFFFFFFFFFFF
    ):
        return _reference["put_index_entry"](buf, hash_slot_num, entry_no, key_hash, phy_offset, time_diff)
    try:
        PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
    except (BufferError, TypeError):
        return _reference["put_index_entry"](buf, hash_slot_num, entry_no, key_hash, phy_offset, time_diff)
    try:
        slot_at = HEADER + (<Py_ssize_t>key_hash % <Py_ssize_t>hash_slot_num) * SLOT
        entry_at = HEADER + <Py_ssize_t>hash_slot_num * SLOT + <Py_ssize_t>entry_no * ENTRY
        if slot_at + SLOT > view.len or entry_at + ENTRY > view.len:
            prev = -1
        else:
            b = <uint8_t*>view.buf
            prev = <int32_t>((<uint32_t>b[slot_at] << 24) | (<uint32_t>b[slot_at + 1] << 16)
                             | (<uint32_t>b[slot_at + 2] << 8) | b[slot_at + 3])
            if prev <= 0 or prev > <int32_t>entry_no:
                prev = 0
            _put32(b + entry_at, <uint32_t><int32_t>key_hash)
            _put32(b + entry_at + 4, <uint32_t>(<uint64_t><int64_t>phy_offset >> 32))
            _put32(b + entry_at + 8, <uint32_t><uint64_t><int64_t>phy_offset)
            _put32(b + entry_at + 12, <uint32_t><int32_t>time_diff)
            _put32(b + entry_at + 16, <uint32_t>prev)
            _put32(b + slot_at, <uint32_t><int32_t>entry_no)
    finally:
        PyBuffer_Release(&view)
    if prev < 0:  # past the buffer: the reference raises as struct does
        return _reference["put_index_entry"](buf, hash_slot_num, entry_no, key_hash, phy_offset, time_diff)
    return prev
