# What other compiled modules call of store/format/_records.pyx straight, without a Python call.
from libc.stdint cimport int64_t


cdef class Encoder:
    # ``CommitLog.put``'s encoder contract with a C entry: calling the object is the Python contract
    # (``encode(dest, pos, limit, item, queue_offset, physical_offset, store_timestamp)``); ``write`` is the same
    # for values the caller already holds in their C ranges, called through the vtable by the compiled locked
    # section (store/_commitlog.pyx) with no Python call and no int object made.
    cdef Py_ssize_t write(self, object dest, Py_ssize_t pos, Py_ssize_t limit, object item, int64_t queue_offset,
                          int64_t physical_offset, int64_t store_timestamp) except? -1
