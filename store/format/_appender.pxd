# What FastPut's compiled twin (store/_commitlog.pyx) calls of store/format/_appender.pyx straight, without a
# Python call: the reader of a send's fields, the item it makes (written by the ``put_prepared`` encoder), and
# ``delay.may_park``.
from store.format._record_writer cimport Fields


cdef class Prepared:
    cdef Fields f
    cdef tuple keep
    cdef bytes extra


cdef object prepare(object topic, object queue_id, object body, object props, object flag, object sys_flag,
                    object born_timestamp, object born_host, object reconsume_times, object cluster,
                    object store_host, object max_body)


cdef bint may_park(bytes props)
