# The record writer of the compiled twins (cimported; inlined into each): a MessageRecord's fields read once into
# a C struct, then written out in the layout of ``records.encode_record``.  ``_records`` (encode_record,
# put_record), ``_appender`` (the single put, the wire send) and ``_runs`` (a send's run) share it, so the layout
# is written once.
from cpython.bytes cimport PyBytes_AS_STRING
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy
from store.format._bigendian cimport _fits32, _fits64, _put32, _put64
from store.format._crc cimport FAST_CRC_FROM, _body_crc
from store.format._layout cimport BORN_V6, MAGIC_V1, MAGIC_V2, STORE_V6


cdef inline int _record_length(int sys_flag, Py_ssize_t body_len, Py_ssize_t topic_len, Py_ssize_t props_len,
                               int32_t magic) noexcept nogil:
    # records.record_length
    return (48 + (20 if sys_flag & BORN_V6 else 8) + 8 + (20 if sys_flag & STORE_V6 else 8) + 16
            + body_len + (2 if magic == MAGIC_V2 else 1) + topic_len + 2 + props_len)


cdef inline bint _has_cluster(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """``properties.property_value(props, "CLUSTER") is not None``: the last segment opening with CLUSTER 0x01
    has a non-empty value (a send's record gets the broker's CLUSTER unless it has one)."""
    cdef Py_ssize_t q = 0, seg
    cdef bint found = False
    while q <= n:
        seg = q
        while q < n and p[q] != 2:
            q += 1
        if q - seg >= 8 and memcmp(p + seg, b"CLUSTER\x01", 8) == 0:
            found = q - seg > 8
        q += 1
    return found


cdef inline Py_ssize_t _unclosed(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """1 when properties ``p`` end without a 0x02 (Java 4.9.8's clients leave the last one off), else 0: the
    separator ``properties.append_properties`` puts before what it appends."""
    return 1 if n and p[n - 1] != 2 else 0


cdef inline Py_ssize_t _cluster_len(const uint8_t* p, Py_ssize_t n, Py_ssize_t extra_len) noexcept nogil:
    """How much of a send's extra (``0x02 CLUSTER 0x01 name 0x02``, of ``extra_len`` bytes) follows properties
    ``p``: none when they hold a CLUSTER, else its tail, with the leading separator when :func:`_unclosed`. The
    extra's last ``_cluster_len`` bytes are the ones written."""
    if _has_cluster(p, n):
        return 0
    return extra_len - 1 + _unclosed(p, n)


cdef struct Fields:
    # a record to encode, as read from a MessageRecord; the pointers are into objects the reader's caller keeps
    int32_t magic, crc, queue_id, flag, sys_flag, born_port, store_port, reconsume
    int64_t qoff, phys, born_ts, store_ts, prepared
    const uint8_t* topic
    const uint8_t* born_ip
    const uint8_t* store_ip
    const uint8_t* body
    const uint8_t* props
    const uint8_t* extra  # written right after props (a send's CLUSTER property); extra_len 0 for none
    Py_ssize_t topic_len, born_len, store_len, body_len, props_len, extra_len, total


cdef inline bytes _packed_ip(dict cache, object pack_ip, object ip):
    """``msgid.pack_ip`` through a small cache of this module's (few distinct hosts)."""
    packed = cache.get(ip)
    if packed is None:
        packed = pack_ip(ip)
        if len(cache) < 4096:
            cache[ip] = packed
    return packed


cdef inline tuple _read_fields(rec, Fields* f, dict ip_cache, object pack_ip, object fast_crc32):
    """Fill ``f`` from ``rec``: the objects ``f`` points into (the caller keeps them while it writes), or None
    when the reference must encode it (V2 topics, odd magics, errors: rare, the reference's job)."""
    return _read_values(
        rec.topic.encode("utf-8"), rec.magic, rec.body, rec.properties, rec.body_crc, rec.sys_flag, rec.born_host, rec.store_host,
        rec.queue_id, rec.flag, rec.queue_offset, rec.physical_offset, rec.born_timestamp, rec.store_timestamp,
        rec.reconsume_times, rec.prepared_transaction_offset, f, ip_cache, pack_ip, fast_crc32,
    )


cdef inline tuple _read_values(
    bytes topic, magic, body, props, crc, sys_flag_in, born_host, store_host, queue_id, flag, qoff, phys, born_ts,
    store_ts, reconsume, prepared, Fields* f, dict ip_cache, object pack_ip, object fast_crc32,
):
    """:func:`_read_fields` of a record's fields already read (in ``MessageRecord``'s names and order; the topic
    encoded)."""
    if (
        (magic is not None and (type(magic) is not int or (magic != MAGIC_V1 and magic != MAGIC_V2)))
        or len(topic) > 127
        or type(body) is not bytes
        or len(body) > 0x7FFFFFFF
        or type(props) is not bytes
        or len(props) > 32767
    ):
        return None
    born_ip = _packed_ip(ip_cache, pack_ip, born_host[0])
    store_ip = _packed_ip(ip_cache, pack_ip, store_host[0])
    born_port, store_port = born_host[1], store_host[1]
    if not (
        (crc is None or _fits32(crc)) and _fits32(queue_id) and _fits32(flag) and _fits32(sys_flag_in)
        and _fits32(born_port) and _fits32(store_port) and _fits32(reconsume) and _fits64(qoff) and _fits64(phys)
        and _fits64(born_ts) and _fits64(store_ts) and _fits64(prepared)
    ):
        return None  # the reference raises struct.error as struct.pack does
    f.magic = MAGIC_V1 if magic is None else magic
    f.topic = <const uint8_t*>PyBytes_AS_STRING(topic)
    f.topic_len = len(topic)
    f.born_ip = <const uint8_t*>PyBytes_AS_STRING(born_ip)
    f.born_len = len(born_ip)
    f.store_ip = <const uint8_t*>PyBytes_AS_STRING(store_ip)
    f.store_len = len(store_ip)
    f.body = <const uint8_t*>PyBytes_AS_STRING(body)
    f.body_len = len(body)
    f.props = <const uint8_t*>PyBytes_AS_STRING(props)
    f.props_len = len(props)
    f.extra = NULL
    f.extra_len = 0
    if crc is not None:
        f.crc = <int32_t>crc
    elif fast_crc32 is not None and f.body_len >= FAST_CRC_FROM:
        f.crc = <int32_t>(<uint32_t>fast_crc32(body) & 0x7FFFFFFF)  # the body itself: no memoryview of it made
    else:
        f.crc = <int32_t>_body_crc(fast_crc32, f.body, f.body_len)
    f.queue_id, f.flag, f.reconsume = queue_id, flag, reconsume
    f.born_port, f.store_port = born_port, store_port
    f.qoff, f.phys, f.born_ts, f.store_ts, f.prepared = qoff, phys, born_ts, store_ts, prepared
    f.sys_flag = <int32_t>sys_flag_in & ~(BORN_V6 | STORE_V6)
    if f.born_len == 16:
        f.sys_flag |= BORN_V6
    if f.store_len == 16:
        f.sys_flag |= STORE_V6
    f.total = _record_length(f.sys_flag, f.body_len, f.topic_len, f.props_len, f.magic)
    return (topic, born_ip, store_ip, body, props)


cdef inline void _write_after_head(uint8_t* p, const Fields* f) noexcept nogil:
    """Every field of the record but TOTALSIZE and MAGIC (``records.encode_record``)."""
    _put32(p + 8, <uint32_t>f.crc)
    _put32(p + 12, <uint32_t>f.queue_id)
    _put32(p + 16, <uint32_t>f.flag)
    _put64(p + 20, <uint64_t>f.qoff)
    _put64(p + 28, <uint64_t>f.phys)
    _put32(p + 36, <uint32_t>f.sys_flag)
    _put64(p + 40, <uint64_t>f.born_ts)
    p += 48
    memcpy(p, f.born_ip, f.born_len)
    _put32(p + f.born_len, <uint32_t>f.born_port)
    p += f.born_len + 4
    _put64(p, <uint64_t>f.store_ts)
    memcpy(p + 8, f.store_ip, f.store_len)
    _put32(p + 8 + f.store_len, <uint32_t>f.store_port)
    p += 8 + f.store_len + 4
    _put32(p, <uint32_t>f.reconsume)
    _put64(p + 4, <uint64_t>f.prepared)
    _put32(p + 12, <uint32_t>f.body_len)
    p += 16
    memcpy(p, f.body, f.body_len)
    p += f.body_len
    if f.magic == MAGIC_V2:  # a 2-byte TOPICLENGTH
        p[0] = 0
        p += 1
    p[0] = <uint8_t>f.topic_len
    memcpy(p + 1, f.topic, f.topic_len)
    p += 1 + f.topic_len
    p[0] = <uint8_t>((f.props_len + f.extra_len) >> 8)  # PROPERTIESLENGTH counts both
    p[1] = <uint8_t>(f.props_len + f.extra_len)
    memcpy(p + 2, f.props, f.props_len)
    if f.extra_len:
        memcpy(p + 2 + f.props_len, f.extra, f.extra_len)


cdef inline void _write_head(uint8_t* p, const Fields* f) noexcept nogil:
    _put32(p, <uint32_t>f.total)
    _put32(p + 4, <uint32_t>f.magic)
