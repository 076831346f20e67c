# A CommitLog record's header read from raw bytes, for the compiled scanners that walk a log (store/_dispatch.pyx,
# the rebuild's pipelines/index_rebuild/_scan.pyx; cimported and inlined into each), with every length check that
# ``records.check_record`` makes given the walk's size, so that both take or leave a record alike.  The reference
# is store/format/records.py (``header_fields``, the ``*_POS`` offsets, ``check_record``, ``decode_record``).
from libc.stdint cimport int32_t, int64_t, uint8_t
from store.format._bigendian cimport _i16, _i64, _u32
from store.format._layout cimport BORN_V6, MAGIC_V1, MAGIC_V2, MIN_RECORD, STORE_V6


cdef enum:
    # where each field sits, up to BORNHOST; from there on the fields move with the hosts' sizes
    TOTAL_SIZE_AT = 0
    MAGIC_AT = 4
    BODY_CRC_AT = 8
    QUEUE_ID_AT = 12
    FLAG_AT = 16
    QUEUE_OFFSET_AT = 20
    PHYSICAL_OFFSET_AT = 28
    SYS_FLAG_AT = 36
    BORN_TIMESTAMP_AT = 40
    BORN_HOST_AT = 48
    # a host: its address (4 bytes IPv4, 16 IPv6, as the sysFlag's BORN_V6 / STORE_V6 bit says), then its port
    HOST_V4 = 8
    HOST_V6 = 20
    # after the store host: RECONSUMETIMES (4), PREPAREDTRANSACTIONOFFSET (8), BODYLENGTH (4), then the body
    AFTER_STORE_HOST = 16


ctypedef struct RecordHeader:
    Py_ssize_t total_size
    int32_t magic
    int32_t body_crc
    int32_t queue_id
    int32_t flag
    int64_t queue_offset
    int64_t physical_offset
    int32_t sys_flag
    int64_t born_timestamp
    Py_ssize_t born_host_at, born_host_len  # address and port
    int64_t store_timestamp
    Py_ssize_t store_host_at, store_host_len
    int32_t reconsume_times
    int64_t prepared_transaction_offset
    Py_ssize_t body_at, body_len
    Py_ssize_t topic_at, topic_len  # the topic's bytes (its length field is 1 byte for MAGIC_V1, 2 for V2)
    Py_ssize_t properties_at, properties_len


cdef inline bint _read_record(const uint8_t* r, Py_ssize_t left, RecordHeader* h) noexcept nogil:
    # The message record at r (``left`` bytes readable from r) into h: True when it is whole, every length within
    # its TOTALSIZE and adding up to it; False for anything else (fewer than 8 bytes, BLANK, zeros, a bad magic
    # or length), which a scanner hands to the reference to word.  Offsets in h count from r.
    cdef Py_ssize_t total, p
    if left < 8:
        return False
    total = <int32_t>_u32(r + TOTAL_SIZE_AT)
    h.magic = <int32_t>_u32(r + MAGIC_AT)
    if not ((h.magic == MAGIC_V1 or h.magic == MAGIC_V2) and MIN_RECORD <= total <= left):
        return False
    h.total_size = total
    h.sys_flag = <int32_t>_u32(r + SYS_FLAG_AT)
    h.born_host_at = BORN_HOST_AT
    h.born_host_len = HOST_V6 if h.sys_flag & BORN_V6 else HOST_V4
    p = BORN_HOST_AT + h.born_host_len + 8  # past BORNHOST and STORETIMESTAMP
    h.store_host_at = p
    h.store_host_len = HOST_V6 if h.sys_flag & STORE_V6 else HOST_V4
    p += h.store_host_len + AFTER_STORE_HOST
    if total < p:
        return False
    h.body_crc = <int32_t>_u32(r + BODY_CRC_AT)
    h.queue_id = <int32_t>_u32(r + QUEUE_ID_AT)
    h.flag = <int32_t>_u32(r + FLAG_AT)
    h.queue_offset = _i64(r + QUEUE_OFFSET_AT)
    h.physical_offset = _i64(r + PHYSICAL_OFFSET_AT)
    h.born_timestamp = _i64(r + BORN_TIMESTAMP_AT)
    h.store_timestamp = _i64(r + h.store_host_at - 8)
    h.reconsume_times = <int32_t>_u32(r + p - 16)
    h.prepared_transaction_offset = _i64(r + p - 12)
    h.body_len = <int32_t>_u32(r + p - 4)
    h.body_at = p
    if h.body_len < 0 or p + h.body_len > total:
        return False
    p += h.body_len
    if h.magic == MAGIC_V2:
        if p + 2 > total:
            return False
        h.topic_len = _i16(r + p)
        p += 2
    else:
        if p + 1 > total:
            return False
        h.topic_len = <signed char>r[p]
        p += 1
    if h.topic_len < 0 or p + h.topic_len + 2 > total:
        return False
    h.topic_at = p
    p += h.topic_len
    h.properties_len = _i16(r + p)
    p += 2
    if h.properties_len < 0 or p + h.properties_len > total:
        return False
    h.properties_at = p
    return p + h.properties_len == total  # records.record_length: the fields add up to TOTALSIZE
