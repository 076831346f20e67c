# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of :mod:`store.format.runs` (the reference): a send's records encoded into one run, the
MessageBatch body decoded and encoded in one pass, the run copied into a segment in one piece and back-filled,
its message ids.  A V1 record of IPv4/IPv6 hosts with every integer in range is done here; anything else (a
malformed batch body, an oversized item, a topic over 127 bytes, a run whose sizes do not add up) is handed to
the reference, so errors and their wording exist once; the differential fuzzers hold both to the same answers.
"""

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from store.format._crc cimport _body_crc
from store.format._bigendian cimport _fits32, _fits64, _put64, _u32
from libc.string cimport memcpy
from store.format._layout cimport BORN_V6, MAGIC_V1, MIN_RECORD, STORE_V6
from store.format._record_writer cimport (
    Fields, _cluster_len, _has_cluster, _unclosed, _write_after_head, _write_head,
)

from store.format import native
from store.format.msgid import create_offset_msg_id, pack_ip


cdef Py_ssize_t ITEM_HEAD = 20  # TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLENGTH of a batch item
cdef Py_ssize_t MAX_PROPS = 32767

_reference = native.TWINS["store.format.runs"].python
_fast_crc32 = native.fast_crc32()
_host_prefix = {}  # store host -> the hex of ip + port that opens its offset message ids


cdef inline bint _host_ok(object host):
    return type(host) is tuple and len(host) == 2 and type(host[0]) is str and _fits32(host[1])


cdef struct Fixed:
    # what every record of one send shares
    const uint8_t* topic
    Py_ssize_t topic_len
    int32_t queue_id
    int32_t sys_flag  # host V6 bits already set
    int64_t born_ts
    const uint8_t* born_ip
    Py_ssize_t born_len
    int32_t born_port
    const uint8_t* store_ip
    Py_ssize_t store_len
    int32_t store_port
    int32_t reconsume
    const uint8_t* extra  # 0x02 CLUSTER 0x01 name 0x02: its tail (_cluster_len) follows properties lacking CLUSTER
    Py_ssize_t extra_len


cdef inline Py_ssize_t _length(const Fixed* f, Py_ssize_t body_len, Py_ssize_t props_len) noexcept nogil:
    # records.record_length of a V1 record
    return 48 + f.born_len + 4 + 8 + f.store_len + 4 + 16 + body_len + 1 + f.topic_len + 2 + props_len


cdef Py_ssize_t _encode_into(uint8_t* p, const Fixed* f, int32_t flag, const uint8_t* body, Py_ssize_t body_len,
                             const uint8_t* props, Py_ssize_t props_len, Py_ssize_t extra_len,
                             uint32_t crc) noexcept nogil:
    """records.encode_record of a fresh V1 record (offsets and store time 0, to be back-filled); its size."""
    cdef Fields r
    r.magic, r.crc, r.queue_id, r.flag, r.sys_flag = MAGIC_V1, <int32_t>crc, f.queue_id, flag, f.sys_flag
    r.born_port, r.store_port, r.reconsume = f.born_port, f.store_port, f.reconsume
    r.qoff, r.phys, r.born_ts, r.store_ts, r.prepared = 0, 0, f.born_ts, 0, 0
    r.topic, r.topic_len = f.topic, f.topic_len
    r.born_ip, r.born_len, r.store_ip, r.store_len = f.born_ip, f.born_len, f.store_ip, f.store_len
    r.body, r.body_len, r.props, r.props_len = body, body_len, props, props_len
    r.extra, r.extra_len = f.extra + f.extra_len - extra_len, extra_len
    r.total = _length(f, body_len, props_len + r.extra_len)
    _write_after_head(p, &r)  # the shared record writer (_record_writer.pxd)
    _write_head(p, &r)
    return r.total


cdef bint _fixed(Fixed* f, bytes topic_b, queue_id, sys_flag, born_ts, born_host, store_host, reconsume,
                 bytes born_ip, bytes store_ip, bytes extra):
    """Fill ``f`` from the arguments (checked by _args_ok, the topic by the caller); False for an odd address."""
    if len(born_ip) not in (4, 16) or len(store_ip) not in (4, 16):
        return False
    cdef int32_t sf = <int32_t>sys_flag & ~(BORN_V6 | STORE_V6)
    if len(born_ip) == 16:
        sf |= BORN_V6
    if len(store_ip) == 16:
        sf |= STORE_V6
    f.topic = <const uint8_t*>PyBytes_AS_STRING(topic_b)
    f.topic_len = len(topic_b)
    f.queue_id = <int32_t>queue_id
    f.sys_flag = sf
    f.born_ts = <int64_t>born_ts
    f.born_ip = <const uint8_t*>PyBytes_AS_STRING(born_ip)
    f.born_len = len(born_ip)
    f.born_port = <int32_t>born_host[1]
    f.store_ip = <const uint8_t*>PyBytes_AS_STRING(store_ip)
    f.store_len = len(store_ip)
    f.store_port = <int32_t>store_host[1]
    f.reconsume = <int32_t>reconsume
    f.extra = <const uint8_t*>PyBytes_AS_STRING(extra)
    f.extra_len = len(extra)
    return True


cdef inline bint _args_ok(topic, queue_id, sys_flag, born_ts, born_host, store_host, reconsume, cluster):
    return (
        type(topic) is str and _fits32(queue_id) and _fits32(sys_flag) and _fits64(born_ts) and _host_ok(born_host)
        and _host_ok(store_host) and _fits32(reconsume) and type(cluster) is str
    )


def encode_message(topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host, store_host,
                   reconsume_times, cluster):
    """Mirrors ``runs.encode_message``."""
    cdef Fixed f
    if not (
        _args_ok(topic, queue_id, sys_flag, born_timestamp, born_host, store_host, reconsume_times, cluster)
        and type(body) is bytes and type(props) is bytes and _fits32(flag) and len(body) <= 0x7FFFFFFF
    ):
        return _reference["encode_message"](topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host,
                                            store_host, reconsume_times, cluster)
    cdef const uint8_t* pp = <const uint8_t*>PyBytes_AS_STRING(props)
    cdef Py_ssize_t props_len = len(props)
    cdef bint add = not _has_cluster(pp, props_len)
    cdef bytes extra_b = ("\x02CLUSTER\x01" + cluster + "\x02").encode("utf-8") if add else b""
    cdef Py_ssize_t extra_len = len(extra_b) - 1 + _unclosed(pp, props_len) if add else 0
    cdef bytes topic_b = topic.encode("utf-8")
    # the reference's order: the topic and properties checks before the addresses are parsed
    if len(topic_b) > 127 or props_len + extra_len > MAX_PROPS or not _fixed(
        &f, topic_b, queue_id, sys_flag, born_timestamp, born_host, store_host, reconsume_times,
        pack_ip(born_host[0]), pack_ip(store_host[0]), extra_b,
    ):
        return _reference["encode_message"](topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host,
                                            store_host, reconsume_times, cluster)
    cdef Py_ssize_t body_len = len(body)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, _length(&f, body_len, props_len + extra_len))
    cdef const uint8_t* bp = <const uint8_t*>PyBytes_AS_STRING(body)
    _encode_into(<uint8_t*>PyBytes_AS_STRING(out), &f, <int32_t>flag, bp, body_len, pp, props_len, extra_len,
                 _body_crc(_fast_crc32, bp, body_len))
    return out


def encode_batch(body, topic, queue_id, sys_flag, born_timestamp, born_host, store_host, reconsume_times, cluster,
                 max_body):
    """Mirrors ``runs.encode_batch``: one pass checks the body and sizes the run, a second encodes into it."""
    cdef Fixed f
    if not (
        type(body) is bytes and len(body) > 0
        and _args_ok(topic, queue_id, sys_flag, born_timestamp, born_host, store_host, reconsume_times, cluster)
        and type(max_body) is int and 0 <= max_body <= 0x7FFFFFFF
    ):
        return _reference["encode_batch"](body, topic, queue_id, sys_flag, born_timestamp, born_host, store_host,
                                          reconsume_times, cluster, max_body)
    cdef bytes extra_b, topic_b, born_ip, store_ip
    try:  # the reference reads the body first: its errors come before these
        extra_b = ("\x02CLUSTER\x01" + cluster + "\x02").encode("utf-8")
        topic_b = topic.encode("utf-8")
        born_ip, store_ip = pack_ip(born_host[0]), pack_ip(store_host[0])
    except ValueError:
        return _reference["encode_batch"](body, topic, queue_id, sys_flag, born_timestamp, born_host, store_host,
                                          reconsume_times, cluster, max_body)
    if len(topic_b) > 127 or not _fixed(&f, topic_b, queue_id, sys_flag, born_timestamp, born_host, store_host,
                                        reconsume_times, born_ip, store_ip, extra_b):
        return _reference["encode_batch"](body, topic, queue_id, sys_flag, born_timestamp, born_host, store_host,
                                          reconsume_times, cluster, max_body)
    cdef const uint8_t* b = <const uint8_t*>PyBytes_AS_STRING(body)
    cdef Py_ssize_t end = len(body), pos = 0, p, body_len, props_len, props_total, total = 0, count = 0
    cdef int32_t item_total
    cdef int16_t props_short
    cdef int64_t limit = max_body
    # pass 1: decode_batch_body's checks, each item's size as a record
    while pos < end:
        if end - pos < ITEM_HEAD + 2:
            break
        item_total = <int32_t>_u32(b + pos)
        body_len = <int32_t>_u32(b + pos + 16)
        p = pos + ITEM_HEAD
        if body_len < 0 or p + body_len + 2 > end or body_len > limit:
            break
        p += body_len
        props_short = <int16_t>((b[p] << 8) | b[p + 1])
        props_len = props_short
        p += 2
        if props_len < 0 or p + props_len > end or item_total != p + props_len - pos:
            break
        props_total = props_len + _cluster_len(b + p, props_len, f.extra_len)
        if props_total > MAX_PROPS:
            break
        total += _length(&f, body_len, props_total)
        count += 1
        pos = p + props_len
    if pos != end:  # a malformed item, an oversized one: the reference raises its error
        return _reference["encode_batch"](body, topic, queue_id, sys_flag, born_timestamp, born_host, store_host,
                                          reconsume_times, cluster, max_body)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    cdef int32_t flag
    pos = 0
    # The GIL is kept: a few µs released here would hand it to the dispatch thread for a switch interval.
    while pos < end:
        flag = <int32_t>_u32(b + pos + 12)
        body_len = <int32_t>_u32(b + pos + 16)
        p = pos + ITEM_HEAD + body_len
        props_len = <int16_t>((b[p] << 8) | b[p + 1])
        o += _encode_into(o, &f, flag, b + pos + ITEM_HEAD, body_len, b + p + 2, props_len,
                          _cluster_len(b + p + 2, props_len, f.extra_len),
                          _body_crc(_fast_crc32, b + pos + ITEM_HEAD, body_len))
        pos = p + 2 + props_len
    return out, count


cdef Py_ssize_t _run_end(const uint8_t* r, Py_ssize_t n, Py_ssize_t count) noexcept nogil:
    """``runs._record_sizes`` succeeds: -1 unless ``count`` >= 1 records of sane TOTALSIZE fill exactly ``n``."""
    cdef Py_ssize_t pos = 0, i
    cdef int32_t size
    if count < 1:
        return -1
    for i in range(count):
        if n - pos < MIN_RECORD:
            return -1
        size = <int32_t>_u32(r + pos)
        if size < MIN_RECORD or size > n - pos:
            return -1
        pos += size
    return pos if pos == n else -1


def write_run(dest, pos, run, count, queue_offset, physical_offset, store_timestamp, advances):
    """Mirrors ``runs.write_run``: one memcpy, then the back-fill of each record, the first head last."""
    cdef Py_buffer view
    if not (
        type(run) is bytes and type(pos) is int and type(count) is int and 0 <= pos <= 0x7FFFFFFFFFFF
        and 0 < count <= 0x7FFFFFFF and _fits64(queue_offset) and _fits64(physical_offset)
        and _fits64(store_timestamp) and type(advances) is bool
    ):
        return _reference["write_run"](dest, pos, run, count, queue_offset, physical_offset, store_timestamp,
                                       advances)
    cdef const uint8_t* r = <const uint8_t*>PyBytes_AS_STRING(run)
    cdef Py_ssize_t n = len(run), at = pos, i, p
    if (_run_end(r, n, count) < 0 or physical_offset > 0x7FFFFFFFFFFFFFFF - n
            or queue_offset > 0x7FFFFFFFFFFFFFFF - count):
        return _reference["write_run"](dest, pos, run, count, queue_offset, physical_offset, store_timestamp,
                                       advances)
    try:
        PyObject_GetBuffer(dest, &view, PyBUF_WRITABLE)
    except (BufferError, TypeError):
        return _reference["write_run"](dest, pos, run, count, queue_offset, physical_offset, store_timestamp,
                                       advances)
    cdef uint8_t* d
    cdef int64_t q = queue_offset, phys = physical_offset, ts = store_timestamp
    cdef bint adv = advances
    cdef Py_ssize_t cnt = count
    try:
        if at + n > view.len:
            return _reference["write_run"](dest, pos, run, count, queue_offset, physical_offset, store_timestamp,
                                           advances)
        d = <uint8_t*>view.buf + at
        # Under the put lock and the GIL: released, the GIL would go to the dispatch thread for a switch interval.
        memcpy(d + 8, r + 8, n - 8)
        p = 0
        for i in range(cnt):
            # records.patch_record: QUEUEOFFSET, PHYSICALOFFSET, then STORETIMESTAMP after the born host
            _put64(d + p + 20, <uint64_t>q)
            _put64(d + p + 28, <uint64_t>(phys + p))
            _put64(d + p + (68 if d[p + 39] & BORN_V6 else 56), <uint64_t>ts)
            p += <int32_t>_u32(r + p)
            if adv:
                q += 1
        memcpy(d, r, 8)
    finally:
        PyBuffer_Release(&view)


def offset_msg_ids(store_host, offset, run, count):
    """Mirrors ``runs.offset_msg_ids``."""
    if not (type(run) is bytes and type(count) is int and 0 < count <= 0x7FFFFFFF and _fits64(offset)
            and _host_ok(store_host)):
        return _reference["offset_msg_ids"](store_host, offset, run, count)
    cdef const uint8_t* r = <const uint8_t*>PyBytes_AS_STRING(run)
    cdef Py_ssize_t n = len(run)
    if _run_end(r, n, count) < 0:
        return _reference["offset_msg_ids"](store_host, offset, run, count)
    prefix = _host_prefix.get(store_host)
    if prefix is None:
        prefix = create_offset_msg_id(store_host, 0)
        prefix = _host_prefix[store_host] = prefix[: len(prefix) - 16].encode("ascii")
    cdef bytes pre = prefix
    cdef Py_ssize_t plen = len(pre), one = plen + 16, i, j, p = 0, cnt = count
    cdef bytes out = PyBytes_FromStringAndSize(NULL, cnt * (one + 1) - 1)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    cdef uint64_t off = <uint64_t><int64_t>offset
    cdef int32_t size
    cdef const char* hexd = b"0123456789ABCDEF"
    for i in range(cnt):
        if i:
            o[0] = 44  # ','
            o += 1
        memcpy(o, PyBytes_AS_STRING(pre), plen)
        for j in range(16):
            o[plen + j] = hexd[(off >> (60 - 4 * j)) & 0xF]
        o += one
        size = <int32_t>_u32(r + p)
        p += size
        off += <uint64_t>size
    return out.decode("ascii")
