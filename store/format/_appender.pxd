# What CommitLog.put's compiled twin (store/_commitlog.pyx) calls of store/format/_appender.pyx straight, without
# a Python call: the item prepare_send makes and the encoder that writes it.
from libc.stdint cimport int64_t
from store.format._record_writer cimport Fields


cdef class Prepared:
    cdef Fields f
    cdef tuple keep
    cdef bytes extra


cdef Py_ssize_t write_prepared(Prepared prepared, object dest, Py_ssize_t pos, Py_ssize_t limit, int64_t queue_offset,
                               int64_t physical_offset, int64_t store_timestamp) except? -1
