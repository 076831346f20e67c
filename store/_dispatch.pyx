# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled dispatch loop: a run of CommitLog records into their ConsumeQueue units and IndexFile entries,
with the GIL released over the whole run (or kept over a short one: see ``store.dispatch_loop``).

The reference is the reput service's per-record Python path (``store.dispatch``: ``records.check_record``, then
``ConsumeQueue.put`` and ``IndexService.build_index``).  This loop writes exactly the bytes those would write, for
the records it can take whole: a message record that passes every length check of ``check_record``, with an
ASCII topic, tags and keys, whose queue is registered here with room for its unit and whose keys fit the current
IndexFile.  At any other record (not a message, odd bytes, a queue not registered or whose file is full, an
IndexFile to roll, a delay-level tags code to compute) it stops and hands that one record to the reference; the
Python side (``store.dispatch_loop``) then registers the files the reference used and runs this loop again.

Per run, with the GIL held again: each touched queue's ``MappedFile.wrote`` and ``max_physic_offset``, the
IndexFile header (bytes and ``IndexHeader``), then the arrival listeners, one call per consumable record.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from store.format._segments cimport PropertySpans, _property_spans
from store.format._java_strings cimport _abs_hash, _ascii, _hash
from store.format._bigendian cimport _put32, _put64, _u32
from libc.string cimport memcmp, memcpy, memset
from store.format._record_header cimport RecordHeader, _read_record

from store.format import delay as _delay

cdef Py_ssize_t UNIT = 20
cdef Py_ssize_t INDEX_HEADER = 40
cdef Py_ssize_t INDEX_SLOT = 4
cdef Py_ssize_t INDEX_ENTRY = 20
cdef int64_t SANE = <int64_t>1 << 62  # offsets and times beyond it go to the reference (no int64 overflow here)
_SANE = 1 << 62

cdef bytes _SCHEDULE = _delay.SCHEDULE_TOPIC.encode()
cdef const uint8_t* SCHEDULE_P = <const uint8_t*><const char*>_SCHEDULE
cdef Py_ssize_t SCHEDULE_LEN = len(_SCHEDULE)


ctypedef struct Target:
    # a (topic, queueId) registered by the Python side: the ConsumeQueue's last file, mapped
    uint8_t* topic
    Py_ssize_t topic_len
    int32_t queue_id
    bint writable  # False: every record of this queue goes to the reference
    Py_buffer view
    Py_ssize_t file_size
    Py_ssize_t wrote
    int64_t file_from
    int64_t max_phys
    bint touched


ctypedef struct Arrival:
    int32_t target
    int64_t next_offset
    int64_t tags_code
    int64_t store_ts


cdef class DispatchLoop:
    """The C state of dispatch between runs: the registered queues and the current IndexFile."""

    cdef Target* _targets
    cdef Py_ssize_t _n, _cap
    cdef int32_t* _slots  # open addressing over _targets, -1 empty
    cdef Py_ssize_t _slot_cap
    cdef list _owners  # per target: (ConsumeQueue, MappedFile) to write back to, or None
    cdef list _names  # per target: (topic, queueId) for the listeners
    cdef int32_t* _touched
    cdef Py_ssize_t _n_touched
    cdef Arrival* _arrivals
    cdef Py_ssize_t _n_arrivals, _arrivals_cap
    # the IndexFile
    cdef readonly bint index_enabled
    cdef bint _has_index, _index_touched
    cdef Py_buffer _iview
    cdef object _index_file
    cdef Py_ssize_t _hsn, _inum
    cdef int64_t _begin_ts, _end_ts, _begin_phy, _end_phy
    cdef int32_t _slot_count, _index_count
    # what the last run did
    cdef readonly Py_ssize_t count
    cdef readonly int64_t first_ts, last_ts, last_cq_ts
    cdef readonly bint cq_written

    def __cinit__(self, bint index_enabled):
        self.index_enabled = index_enabled
        self._owners = []
        self._names = []
        self._slot_cap = 64
        self._slots = <int32_t*>PyMem_Malloc(self._slot_cap * sizeof(int32_t))
        self._cap = 16
        self._targets = <Target*>PyMem_Malloc(self._cap * sizeof(Target))
        self._touched = <int32_t*>PyMem_Malloc(self._cap * sizeof(int32_t))
        self._arrivals_cap = 1024
        self._arrivals = <Arrival*>PyMem_Malloc(self._arrivals_cap * sizeof(Arrival))
        if not (self._slots and self._targets and self._touched and self._arrivals):
            raise MemoryError()
        memset(self._slots, 0xFF, self._slot_cap * sizeof(int32_t))

    def __dealloc__(self):
        self._release_buffers()
        PyMem_Free(self._slots)
        PyMem_Free(self._targets)
        PyMem_Free(self._touched)
        PyMem_Free(self._arrivals)

    cdef void _release_buffers(self) noexcept:
        cdef Py_ssize_t i
        for i in range(self._n):
            if self._targets[i].writable:
                PyBuffer_Release(&self._targets[i].view)
            PyMem_Free(self._targets[i].topic)
        self._n = 0
        if self._slots != NULL:
            memset(self._slots, 0xFF, self._slot_cap * sizeof(int32_t))
        if self._has_index:
            PyBuffer_Release(&self._iview)
            self._has_index = False

    cdef void _release_all(self) except *:
        self._release_buffers()
        self._owners = []
        self._names = []
        self._index_file = None

    cdef void _drop_index(self) except *:
        if self._has_index:
            PyBuffer_Release(&self._iview)
            self._has_index = False
        self._index_file = None

    def close(self):
        """Release every mapped file held (before the store closes them)."""
        self._release_all()

    def clear_targets(self):
        """Forget every registered queue (a topic was deleted, dispatch restarts elsewhere)."""
        cdef bint had_index = self._has_index
        index_file = self._index_file
        self._release_all()
        if had_index:
            self.set_index(index_file)

    # --- the queue table ----------------------------------------------------------------------------------
    cdef Py_ssize_t _find(self, const uint8_t* topic, Py_ssize_t topic_len, int32_t queue_id) noexcept nogil:
        cdef uint32_t h = _hash(<uint32_t>queue_id * 0x9E3779B1u, topic, topic_len)
        cdef Py_ssize_t mask = self._slot_cap - 1, at = (h ^ (h >> 15)) & mask
        cdef int32_t t
        while True:
            t = self._slots[at]
            if t < 0:
                return -1
            if (self._targets[t].queue_id == queue_id and self._targets[t].topic_len == topic_len
                    and memcmp(self._targets[t].topic, topic, topic_len) == 0):
                return t
            at = (at + 1) & mask

    cdef void _insert_slot(self, Py_ssize_t t) noexcept:
        cdef Target* x = &self._targets[t]
        cdef uint32_t h = _hash(<uint32_t>x.queue_id * 0x9E3779B1u, x.topic, x.topic_len)
        cdef Py_ssize_t mask = self._slot_cap - 1, at = (h ^ (h >> 15)) & mask
        while self._slots[at] >= 0:
            at = (at + 1) & mask
        self._slots[at] = <int32_t>t

    cdef Py_ssize_t _add(self, bytes topic, int32_t queue_id) except -1:
        cdef Py_ssize_t i, n = len(topic)
        cdef int32_t* slots
        cdef Target* grown
        cdef int32_t* touched
        if self._n == self._cap:
            grown = <Target*>PyMem_Realloc(self._targets, 2 * self._cap * sizeof(Target))
            if grown == NULL:
                raise MemoryError()
            self._targets = grown
            touched = <int32_t*>PyMem_Realloc(self._touched, 2 * self._cap * sizeof(int32_t))
            if touched == NULL:
                raise MemoryError()
            self._touched = touched
            self._cap *= 2
        if 2 * (self._n + 1) > self._slot_cap:
            slots = <int32_t*>PyMem_Malloc(2 * self._slot_cap * sizeof(int32_t))
            if slots == NULL:
                raise MemoryError()
            PyMem_Free(self._slots)
            self._slots = slots
            self._slot_cap *= 2
            memset(self._slots, 0xFF, self._slot_cap * sizeof(int32_t))
            for i in range(self._n):
                self._insert_slot(i)
        cdef Target* t = &self._targets[self._n]
        memset(t, 0, sizeof(Target))
        t.topic = <uint8_t*>PyMem_Malloc(n if n > 0 else 1)
        if t.topic == NULL:
            raise MemoryError()
        memcpy(t.topic, <const char*>topic, n)
        t.topic_len = n
        t.queue_id = queue_id
        self._insert_slot(self._n)
        self._n += 1
        self._owners.append(None)
        self._names.append(None)
        return self._n - 1

    def set_target(self, str topic, int queue_id, consume_queue=None, mapped_file=None):
        """Register the queue's file ``mapped_file`` (its last) to write units into, or, without one, make every
        record of the queue go to the reference."""
        cdef bytes raw = topic.encode("utf-8", "surrogatepass")
        cdef Py_ssize_t i = self._find(raw, len(raw), queue_id)
        if i < 0:
            i = self._add(raw, queue_id)
        cdef Target* t = &self._targets[i]
        if t.writable:
            PyBuffer_Release(&t.view)
            t.writable = False
        self._owners[i] = None
        self._names[i] = (topic, queue_id)
        if mapped_file is None:
            return
        file_size, wrote = mapped_file.file_size, mapped_file.wrote
        file_from, max_phys = mapped_file.file_from_offset, consume_queue.max_physic_offset
        if not (0 <= wrote < file_size < _SANE and wrote % UNIT == 0 and -_SANE < file_from < _SANE
                and -_SANE < max_phys < _SANE):
            return  # odd positions (a damaged log dispatched before): the reference takes them
        PyObject_GetBuffer(mapped_file.mm, &t.view, PyBUF_WRITABLE)
        if t.view.len < file_size:
            PyBuffer_Release(&t.view)
            return
        t.file_size, t.wrote, t.file_from, t.max_phys = file_size, wrote, file_from, max_phys
        t.writable = True
        self._owners[i] = (consume_queue, mapped_file)

    @property
    def targets(self):
        return len(self._names)

    # --- the IndexFile ----------------------------------------------------------------------------------
    def set_index(self, index_file):
        """Write index entries into ``index_file`` (the IndexService's last), or, with None, hand every record
        with keys to the reference."""
        self._drop_index()
        if index_file is None or not self.index_enabled:
            return
        h = index_file.header
        hsn, inum = index_file.hash_slot_num, index_file.index_num
        if not (0 < hsn < 0x40000000 and 0 < inum < 0x40000000 and 1 <= h.index_count <= inum
                and 0 <= h.hash_slot_count < 0x7FFFFFFF
                and all(-_SANE < v < _SANE for v in (h.begin_timestamp, h.end_timestamp, h.begin_phy_offset,
                                                    h.end_phy_offset))):
            return
        PyObject_GetBuffer(index_file.mm, &self._iview, PyBUF_WRITABLE)
        self._hsn, self._inum = hsn, inum
        if self._iview.len < INDEX_HEADER + self._hsn * INDEX_SLOT + self._inum * INDEX_ENTRY:
            PyBuffer_Release(&self._iview)
            return
        self._has_index = True
        self._index_file = index_file
        self._begin_ts, self._end_ts = h.begin_timestamp, h.end_timestamp
        self._begin_phy, self._end_phy = h.begin_phy_offset, h.end_phy_offset
        self._slot_count, self._index_count = h.hash_slot_count, h.index_count

    # --- the run ------------------------------------------------------------------------------------------
    def run(self, log, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_records, bint release_gil=True):
        """Dispatch the records of ``log`` (a CommitLog segment's map) from ``pos`` up to ``end``, at most
        ``max_records``; returns where it stopped: ``end``, or a record the reference must take.  The arrival
        listeners are told afterwards, by :meth:`notify`.  ``release_gil`` False keeps the GIL over the run (a
        short one: taking the GIL back from a busy event loop can cost a whole switch interval)."""
        cdef Py_buffer view
        if max_records > self._arrivals_cap:
            max_records = self._arrivals_cap
        self.count = 0
        self._n_touched = 0
        self._n_arrivals = 0
        self._index_touched = False
        if pos < 0:
            return pos
        PyObject_GetBuffer(log, &view, PyBUF_SIMPLE)
        try:
            if end > view.len:
                end = view.len
            if release_gil:
                with nogil:
                    pos = self._run(<const uint8_t*>view.buf, pos, end, max_records)
            else:
                pos = self._run(<const uint8_t*>view.buf, pos, end, max_records)
        finally:
            PyBuffer_Release(&view)
        self._write_back()
        return pos

    cdef Py_ssize_t _run(self, const uint8_t* b, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_records) noexcept nogil:
        cdef const uint8_t* r
        cdef Py_ssize_t total, topic_at, topic_len
        cdef Py_ssize_t e
        cdef Py_ssize_t tags_at, tags_len, keys_at, keys_len, uniq_at, uniq_len, ti, n_keys, k, ks
        cdef int32_t sys_flag
        cdef int64_t phys, qoff, store_ts, expect, tags_code
        cdef bint consumable, indexed, has_delay, write_unit
        cdef RecordHeader rh
        cdef PropertySpans spans
        cdef Target* t
        cdef uint32_t prefix
        while pos < end and self.count < max_records:
            r = b + pos
            if not _read_record(r, end - pos, &rh):
                break  # BLANK, zeros, bad bytes, a length check of records.check_record: the reference words them
            total, sys_flag = rh.total_size, rh.sys_flag
            topic_at, topic_len = rh.topic_at, rh.topic_len
            if not _ascii(r + topic_at, topic_len):
                break  # decoded with replacement, two topics could become one: the reference's job
            _property_spans(r, rh.properties_at, rh.properties_at + rh.properties_len, &spans)
            tags_at, tags_len = spans.tags_at, spans.tags_len
            keys_at, keys_len = spans.keys_at, spans.keys_len
            uniq_at, uniq_len = spans.uniq_at, spans.uniq_len
            has_delay = spans.delay_at >= 0
            if has_delay and topic_len == SCHEDULE_LEN and memcmp(r + topic_at, SCHEDULE_P, topic_len) == 0:
                break  # a delay level's tags code: the reference's schedule_tags_code
            tags_code = 0
            if tags_at >= 0:
                if not _ascii(r + tags_at, tags_len):
                    break
                tags_code = <int32_t>_hash(0, r + tags_at, tags_len)
            phys, qoff, store_ts = rh.physical_offset, rh.queue_offset, rh.store_timestamp
            if not (-SANE < phys < SANE and -SANE < store_ts < SANE and -SANE < qoff < (SANE >> 5)):
                break
            consumable = (sys_flag & 0xC) == 0 or (sys_flag & 0xC) == 8
            # ConsumeQueue.put: decide everything before writing anything
            t = NULL
            write_unit = False
            if consumable:
                ti = self._find(r + topic_at, topic_len, rh.queue_id)
                if ti < 0 or not self._targets[ti].writable:
                    break  # a queue the Python side has not registered, or one it keeps for the reference
                t = &self._targets[ti]
                if phys + total > t.max_phys:  # else already built (re-dispatch after recovery)
                    if t.wrote + UNIT > t.file_size:
                        break  # the file is full: the reference rolls it
                    expect = qoff * UNIT
                    if expect > t.file_from + t.wrote:
                        break  # a gap: the reference warns and writes
                    write_unit = expect == t.file_from + t.wrote  # else built repeatedly
            # IndexService.build_index: UNIQ_KEY, then every KEYS entry; none for a rolled-back record
            indexed = False
            n_keys = 0
            if self.index_enabled and (sys_flag & 0xC) != 0xC:
                if uniq_at >= 0:
                    if not _ascii(r + uniq_at, uniq_len):
                        break
                    n_keys = 1
                if keys_at >= 0:
                    if not _ascii(r + keys_at, keys_len):
                        break
                    k = keys_at
                    while k < keys_at + keys_len:
                        ks = k
                        while k < keys_at + keys_len and r[k] != 32:
                            k += 1
                        if k > ks:
                            n_keys += 1
                        k += 1
                if n_keys > 0:
                    if not self._has_index:
                        break  # no IndexFile yet: the reference creates one
                    if phys >= self._end_phy:  # else already indexed
                        if self._index_count + n_keys > self._inum:
                            break  # the file fills up within this record: the reference rolls it
                        indexed = True
            # write
            if write_unit:
                _put64(<uint8_t*>t.view.buf + t.wrote, <uint64_t>phys)
                _put32(<uint8_t*>t.view.buf + t.wrote + 8, <uint32_t>total)
                _put64(<uint8_t*>t.view.buf + t.wrote + 12, <uint64_t>tags_code)
                t.wrote += UNIT
                t.max_phys = phys + total
                if not t.touched:
                    t.touched = True
                    self._touched[self._n_touched] = <int32_t>(t - self._targets)
                    self._n_touched += 1
            if indexed:
                prefix = 31 * _hash(0, r + topic_at, topic_len) + 35  # "topic#"
                if uniq_at >= 0:
                    self._put_key(_hash(prefix, r + uniq_at, uniq_len), phys, store_ts)
                k = keys_at
                e = keys_at + keys_len
                while k < e:  # properties.split_keys: split on spaces, empties dropped
                    ks = k
                    while k < e and r[k] != 32:
                        k += 1
                    if k > ks:
                        self._put_key(_hash(prefix, r + ks, k - ks), phys, store_ts)
                    k += 1
                self._index_touched = True
            if consumable:
                self._arrivals[self._n_arrivals].target = <int32_t>(t - self._targets)
                self._arrivals[self._n_arrivals].next_offset = qoff + 1
                self._arrivals[self._n_arrivals].tags_code = tags_code
                self._arrivals[self._n_arrivals].store_ts = store_ts
                self._n_arrivals += 1
                self.last_cq_ts = store_ts
            if self.count == 0:
                self.first_ts = store_ts
            self.last_ts = store_ts
            self.count += 1
            pos += total
        return pos

    cdef inline void _put_key(self, uint32_t h, int64_t phys, int64_t store_ts) noexcept nogil:
        """IndexFile.put_key of one key whose ``String.hashCode`` is ``h``, with units.put_index_entry's writes."""
        cdef int64_t time_diff
        cdef Py_ssize_t slot_at, entry_at
        cdef int32_t prev
        cdef uint8_t* ib = <uint8_t*>self._iview.buf
        h = <uint32_t>_abs_hash(h)
        if self._begin_ts <= 0:
            time_diff = 0
        else:
            time_diff = store_ts - self._begin_ts
            time_diff = 0 if time_diff < 0 else time_diff // 1000
            if time_diff > 0x7FFFFFFF:
                time_diff = 0x7FFFFFFF
        slot_at = INDEX_HEADER + (h % <uint32_t>self._hsn) * INDEX_SLOT
        entry_at = INDEX_HEADER + self._hsn * INDEX_SLOT + self._index_count * INDEX_ENTRY
        prev = <int32_t>_u32(ib + slot_at)
        if prev <= 0 or prev > self._index_count:
            prev = 0  # an empty slot, or one left over from a crash before the header was written
        _put32(ib + entry_at, h)
        _put64(ib + entry_at + 4, <uint64_t>phys)
        _put32(ib + entry_at + 12, <uint32_t>time_diff)
        _put32(ib + entry_at + 16, <uint32_t>prev)
        _put32(ib + slot_at, <uint32_t>self._index_count)
        if self._index_count <= 1:
            self._begin_phy = phys
            self._begin_ts = store_ts
        if prev == 0:
            self._slot_count += 1
        self._index_count += 1
        self._end_phy = phys
        self._end_ts = store_ts

    cdef void _write_back(self) except *:
        """What readers look at: each touched queue's file end, the IndexFile's header."""
        cdef Py_ssize_t i
        cdef Target* t
        cdef uint8_t* ib
        for i in range(self._n_touched):
            t = &self._targets[self._touched[i]]
            t.touched = False
            cq, mf = self._owners[self._touched[i]]
            cq.max_physic_offset = t.max_phys
            mf.wrote = t.wrote  # last: a reader sees a unit only once it is whole
        self._n_touched = 0
        self.cq_written = self._n_arrivals > 0
        if self._index_touched:
            ib = <uint8_t*>self._iview.buf
            _put64(ib, <uint64_t>self._begin_ts)
            _put64(ib + 8, <uint64_t>self._end_ts)
            _put64(ib + 16, <uint64_t>self._begin_phy)
            _put64(ib + 24, <uint64_t>self._end_phy)
            _put32(ib + 32, <uint32_t>self._slot_count)
            _put32(ib + 36, <uint32_t>self._index_count)
            h = self._index_file.header
            h.begin_timestamp, h.end_timestamp = self._begin_ts, self._end_ts
            h.begin_phy_offset, h.end_phy_offset = self._begin_phy, self._end_phy
            h.hash_slot_count, h.index_count = self._slot_count, self._index_count

    def notify(self, listeners):
        """Call each listener once per queue that got records in the last run (in the order the queues first
        appear): its topic and queue id, the offset after its newest record, the tags codes of its records in
        queue order (they hold the offsets just before it), the newest record's store time.  One call per queue,
        not per record: on a busy broker these calls held the GIL the event loop needs."""
        cdef Py_ssize_t i
        cdef Arrival* a
        cdef list group
        if not listeners or self._n_arrivals == 0:
            return
        names = self._names
        groups = {}  # target -> [its tags codes, next offset, store time]
        for i in range(self._n_arrivals):
            a = &self._arrivals[i]
            group = groups.get(a.target)
            if group is None:
                group = groups[a.target] = [[], 0, 0]
            (<list>group[0]).append(a.tags_code)
            group[1] = a.next_offset
            group[2] = a.store_ts
        for target, (codes, next_offset, store_ts) in groups.items():
            topic, queue_id = names[target]
            codes = tuple(codes)
            for listener in listeners:
                listener(topic, queue_id, next_offset, codes, store_ts)
