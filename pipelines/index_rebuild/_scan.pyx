# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of the rebuild's per-record scan: a run of CommitLog records into dispatch rows, with the GIL
released, so several splits scan at once on several cores.

The reference is the per-record path of ``pipelines.index_rebuild.scan`` (``records.check_record`` given the walk's
size, then ``records.index_keys`` by RocketMQ 5.x's rule and ``hashing.index_key_hash`` of each key).  This loop
takes the records it can take whole: a message record that passes every length check of ``check_record``, whose
topic, tags and keys are ASCII and whose topic is in the caller's table, that sits at its own PHYSICALOFFSET and
ends by ``bound``.  At any other record (BLANK, zeros, odd bytes, a new or non-ASCII topic, a SCHEDULE_TOPIC_XXXX
record with a delay level, a row or key beyond the arrays' room) it stops, and the Python side takes that one
record with the reference path, then calls again.  The record's header is read, with its length checks, by the
one reader the store's dispatch loop (``store/_dispatch.pyx``) uses too (``store/format/_record_header.pxd``).
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memcmp
from store.format._record_header cimport RecordHeader, _read_record
from store.format._segments cimport PropertySpans, _last_value, _property_spans
from store.format._java_strings cimport _abs_hash, _ascii, _hash

from store.format import delay as _delay

cdef bytes _SCHEDULE = _delay.SCHEDULE_TOPIC.encode()
cdef const uint8_t* SCHEDULE_P = <const uint8_t*><const char*>_SCHEDULE
cdef Py_ssize_t SCHEDULE_LEN = len(_SCHEDULE)
cdef int64_t SANE = <int64_t>1 << 62  # offsets and times beyond it go to the reference

cdef enum:  # why a run stopped
    C_DONE = 0  # reached ``stop``
    C_FULL = 1  # the arrays have no room for the next record's row or keys
    C_REFERENCE = 2  # the record at the returned position is the reference's
DONE, FULL, REFERENCE = C_DONE, C_FULL, C_REFERENCE


cdef Py_ssize_t _find_topic(const uint8_t* t, Py_ssize_t n, const uint8_t** names, Py_ssize_t* lens,
                            Py_ssize_t count, Py_ssize_t hint) noexcept nogil:
    cdef Py_ssize_t i
    if 0 <= hint < count and lens[hint] == n and memcmp(names[hint], t, n) == 0:
        return hint
    for i in range(count):
        if lens[i] == n and memcmp(names[i], t, n) == 0:
            return i
    return -1


def scan_run(const uint8_t[::1] log, int64_t base, Py_ssize_t pos, Py_ssize_t stop, int64_t bound, list topics,
             int32_t[::1] topic, int32_t[::1] queue_id, int64_t[::1] queue_offset, int64_t[::1] phys,
             int32_t[::1] size, int32_t[::1] sys_flag, int64_t[::1] store_ts, int64_t[::1] tags_code,
             int32_t[::1] key_count, uint8_t[::1] tag_key, int32_t[::1] hashes, Py_ssize_t n, Py_ssize_t h):
    """Rows for the records of ``log`` (a segment starting at CommitLog offset ``base``) from ``pos`` while they
    start before ``stop``, written to the arrays from row ``n`` and key ``h`` on; ``bound`` < 0 is none.
    ``topics`` are the raw topics the row's ``topic`` numbers.  Returns (position, rows, keys, why stopped)."""
    cdef Py_ssize_t count = len(topics), i, why = C_DONE
    cdef const uint8_t** names = <const uint8_t**>PyMem_Malloc((count + 1) * sizeof(uint8_t*))
    cdef Py_ssize_t* lens = <Py_ssize_t*>PyMem_Malloc((count + 1) * sizeof(Py_ssize_t))
    if names == NULL or lens == NULL:
        PyMem_Free(names)
        PyMem_Free(lens)
        raise MemoryError()
    for i in range(count):
        raw = topics[i]
        names[i] = <const uint8_t*><const char*>raw  # the list keeps each bytes object alive over the run
        lens[i] = len(raw)
    try:
        with nogil:
            why = _run(&log[0], len(log), base, &pos, stop, bound, names, lens, count, &topic[0], &queue_id[0],
                       &queue_offset[0], &phys[0], &size[0], &sys_flag[0], &store_ts[0], &tags_code[0],
                       &key_count[0], &tag_key[0], &hashes[0], len(topic), len(hashes), &n, &h)
    finally:
        PyMem_Free(names)
        PyMem_Free(lens)
    return pos, n, h, why


cdef Py_ssize_t _run(const uint8_t* b, Py_ssize_t length, int64_t base, Py_ssize_t* at, Py_ssize_t stop,
                     int64_t bound, const uint8_t** names, Py_ssize_t* lens, Py_ssize_t count, int32_t* o_topic,
                     int32_t* o_queue, int64_t* o_qoff, int64_t* o_phys, int32_t* o_size, int32_t* o_flag,
                     int64_t* o_ts, int64_t* o_tags, int32_t* o_nkeys, uint8_t* o_tagkey, int32_t* o_hash,
                     Py_ssize_t rows_cap, Py_ssize_t hash_cap, Py_ssize_t* n_at, Py_ssize_t* h_at) noexcept nogil:
    cdef const uint8_t* r
    cdef Py_ssize_t pos = at[0], n = n_at[0], h = h_at[0], hint = 0
    cdef Py_ssize_t total, topic_at, topic_len, props_at, props_len
    cdef Py_ssize_t k, ks, ke, n_keys, ti, tag_at, tag_len
    cdef int32_t flag
    cdef int64_t phy, qoff, ts, code
    cdef bint indexed
    cdef uint32_t prefix
    cdef RecordHeader rh
    cdef PropertySpans spans
    cdef Py_ssize_t why = C_DONE
    if stop > length:
        stop = length
    while pos < stop:
        r = b + pos
        if not _read_record(r, length - pos, &rh):
            why = C_REFERENCE  # BLANK, zeros, bad bytes, a length check of records.check_record: the reference's
            break
        total, flag = rh.total_size, rh.sys_flag
        topic_at, topic_len = rh.topic_at, rh.topic_len
        props_at, props_len = rh.properties_at, rh.properties_len
        phy, qoff, ts = rh.physical_offset, rh.queue_offset, rh.store_timestamp
        if phy != base + pos or not (-SANE < ts < SANE and -SANE < qoff < SANE):
            why = C_REFERENCE  # the reference names the bad offset
            break
        if bound >= 0 and phy + total > bound:
            why = C_REFERENCE  # the reference ends the split here
            break
        if not _ascii(r + topic_at, topic_len):
            why = C_REFERENCE
            break
        ti = _find_topic(r + topic_at, topic_len, names, lens, count, hint)
        if ti < 0:
            why = C_REFERENCE  # a topic new to the table: the reference adds it
            break
        hint = ti
        _property_spans(r, props_at, props_at + props_len, &spans)
        if spans.delay_at >= 0 and topic_len == SCHEDULE_LEN and memcmp(r + topic_at, SCHEDULE_P, topic_len) == 0:
            why = C_REFERENCE  # a delay level's tags code: the reference's schedule_tags_code
            break
        code = 0
        if spans.tags_at >= 0:
            if not _ascii(r + spans.tags_at, spans.tags_len):
                why = C_REFERENCE
                break
            code = <int32_t>_hash(0, r + spans.tags_at, spans.tags_len)
        # records.index_keys by 5.x's rule: none for a rollback; the UNIQ_KEY, each KEYS entry, then T#tags with
        # the TAGS that properties.property_value finds (the last TAGS segment, absent when its value is empty)
        indexed = (flag & 0xC) != 0xC
        n_keys = 0
        tag_at = -1
        tag_len = 0
        if indexed:
            if spans.uniq_at >= 0:
                if not _ascii(r + spans.uniq_at, spans.uniq_len):
                    why = C_REFERENCE
                    break
                n_keys = 1
            if spans.keys_at >= 0:
                if not _ascii(r + spans.keys_at, spans.keys_len):
                    why = C_REFERENCE
                    break
                k = spans.keys_at
                ke = spans.keys_at + spans.keys_len
                while k < ke:
                    ks = k
                    while k < ke and r[k] != 32:
                        k += 1
                    if k > ks:
                        n_keys += 1
                    k += 1
            tag_at = _last_value(r + props_at, props_len, b"TAGS\x01", 5, &tag_len)
            if tag_at >= 0:
                tag_at += props_at
                if not _ascii(r + tag_at, tag_len):
                    why = C_REFERENCE
                    break
                n_keys += 1
        if n >= rows_cap or h + n_keys > hash_cap:
            why = C_FULL
            break
        o_topic[n] = <int32_t>ti
        o_queue[n] = rh.queue_id
        o_qoff[n] = qoff
        o_phys[n] = phy
        o_size[n] = <int32_t>total
        o_flag[n] = flag
        o_ts[n] = ts
        o_tags[n] = code
        o_nkeys[n] = <int32_t>n_keys
        o_tagkey[n] = tag_at >= 0
        if n_keys:
            prefix = 31 * _hash(0, r + topic_at, topic_len) + 35  # "topic#": hashing.index_key
            if spans.uniq_at >= 0:
                o_hash[h] = _abs_hash(_hash(prefix, r + spans.uniq_at, spans.uniq_len))
                h += 1
            if spans.keys_at >= 0:
                k = spans.keys_at
                ke = spans.keys_at + spans.keys_len
                while k < ke:  # properties.split_keys: split on spaces, empties dropped
                    ks = k
                    while k < ke and r[k] != 32:
                        k += 1
                    if k > ks:
                        o_hash[h] = _abs_hash(_hash(prefix, r + ks, k - ks))
                        h += 1
                    k += 1
            if tag_at >= 0:
                o_hash[h] = _abs_hash(_hash(31 * (31 * prefix + 84) + 35, r + tag_at, tag_len))  # "T#" + tags
                h += 1
        n += 1
        pos += total
    at[0] = pos
    n_at[0] = n
    h_at[0] = h
    return why
