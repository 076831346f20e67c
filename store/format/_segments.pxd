# The scan of a properties string (``name 0x01 value 0x02`` segments, store/format/properties.py) that three
# compiled twins make over raw record bytes, the look-up of the values a record's dispatch needs that two of
# them make, and ``properties.property_value``'s look-up of one name; cimported and inlined into each.
from libc.stdint cimport uint8_t
from libc.string cimport memcmp


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


ctypedef struct PropertySpans:
    # where the values the dispatch of a record needs sit in the record (at: -1 when absent)
    Py_ssize_t tags_at, tags_len, keys_at, keys_len, uniq_at, uniq_len, delay_at, delay_len


cdef inline bint _named(const uint8_t* p, Py_ssize_t n, const char* want, Py_ssize_t want_len) noexcept nogil:
    return n == want_len and memcmp(p, want, n) == 0


cdef inline void _property_spans(const uint8_t* r, Py_ssize_t q, Py_ssize_t e, PropertySpans* s) noexcept nogil:
    # properties.iter_properties over r[q:e]: segments split on 0x02, name 0x01 value, empties dropped; the last wins
    cdef Py_ssize_t seg, name_len, value_at
    s.tags_at = s.keys_at = s.uniq_at = s.delay_at = -1
    s.tags_len = s.keys_len = s.uniq_len = s.delay_len = 0
    while q <= e:
        seg = q
        q = _segment_end(r, q, e)
        name_len = _name_length(r, seg, q)
        value_at = seg + name_len + 1
        if seg + name_len < q and name_len > 0 and value_at < q:
            if _named(r + seg, name_len, b"TAGS", 4):
                s.tags_at, s.tags_len = value_at, q - value_at
            elif _named(r + seg, name_len, b"KEYS", 4):
                s.keys_at, s.keys_len = value_at, q - value_at
            elif _named(r + seg, name_len, b"UNIQ_KEY", 8):
                s.uniq_at, s.uniq_len = value_at, q - value_at
            elif _named(r + seg, name_len, b"DELAY", 5):
                s.delay_at, s.delay_len = value_at, q - value_at
        q += 1


cdef inline Py_ssize_t _last_value(const uint8_t* p, Py_ssize_t n, const char* key, Py_ssize_t key_len,
                                   Py_ssize_t* value_len) noexcept nogil:
    # properties.property_value: where the value of the last segment opening with ``key`` (name and 0x01) starts,
    # its length in value_len; -1 when there is none or its value is empty (absent, as Java's map would have it)
    cdef Py_ssize_t q = 0, seg, at = -1, length = 0
    while q <= n:
        seg = q
        q = _segment_end(p, q, n)
        if q - seg >= key_len and memcmp(p + seg, key, key_len) == 0:
            at, length = seg + key_len, q - seg - key_len
        q += 1
    value_len[0] = length
    return at if length > 0 else -1
