# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of :mod:`store.format.properties` (the reference): ``decode_properties`` in one pass over the
bytes, without the per-segment ``split``/``partition`` objects."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t
from store.format._segments cimport _name_length, _segment_end


def decode_properties(data) -> dict:
    """Mirrors ``properties.decode_properties`` (``string2messageProperties``): ``name 0x01 value 0x02``
    segments; one without 0x01, with an empty name or an empty value is dropped; a later name wins."""
    cdef bytes raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    cdef const uint8_t* r = <const uint8_t*>PyBytes_AS_STRING(raw)
    cdef Py_ssize_t e = len(raw), q = 0, seg, name_len
    out = {}
    while q <= e:
        seg = q
        q = _segment_end(r, q, e)
        name_len = _name_length(r, seg, q)
        if seg + name_len < q and name_len > 0 and seg + name_len + 1 < q:
            out[PyBytes_FromStringAndSize(<const char*>r + seg, name_len).decode("utf-8", "replace")] = \
                PyBytes_FromStringAndSize(<const char*>r + seg + name_len + 1, q - seg - name_len - 1).decode(
                    "utf-8", "replace")
        q += 1
    return out
