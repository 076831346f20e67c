# The fields of a ``dataclass(slots=True)`` instance read and filled straight through their slots, for the
# compiled twins (cimported; inlined into each): what the member descriptors do, without a look-up per field.
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    int T_OBJECT_EX
    int READONLY


cdef inline Py_ssize_t _slot(object cls, str name) except -1:
    """Where an instance of ``cls`` holds field ``name``: a writable object slot (``dataclass(slots=True)``)."""
    descr = cls.__dict__.get(name)
    if type(descr).__name__ != "member_descriptor":
        raise TypeError(f"{cls.__name__}.{name} is not a slot")
    cdef PyMemberDef* member = (<PyMemberDescrObject*><PyObject*>descr).d_member
    if member.type != T_OBJECT_EX or member.flags & READONLY:
        raise TypeError(f"{cls.__name__}.{name} is not a writable object slot")
    return member.offset


cdef inline object _get(object obj, Py_ssize_t offset):
    # a slot's value, as its member descriptor reads it (the caller checked ``type(obj)``)
    cdef PyObject* value = (<PyObject**>((<char*><PyObject*>obj) + offset))[0]
    if value == NULL:
        raise AttributeError(f"{type(obj).__name__} has a field unset")
    return <object>value


cdef inline void _fill(object obj, Py_ssize_t offset, object value):
    # a slot of an object fresh from tp_new (NULL until now): the reference moves into it
    Py_INCREF(value)
    (<PyObject**>((<char*><PyObject*>obj) + offset))[0] = <PyObject*>value


cdef inline void _replace(object obj, Py_ssize_t offset, object value):
    # a slot that may hold a value already: the old reference released after the new one is in place
    cdef PyObject** at = <PyObject**>((<char*><PyObject*>obj) + offset)
    cdef PyObject* old = at[0]
    Py_INCREF(value)
    at[0] = <PyObject*>value
    Py_XDECREF(old)
