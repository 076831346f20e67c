# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of the per-request frame codec of :mod:`broker.remoting.command` (the reference).

``decode_frame`` mirrors ``command.decode_frame`` for the JSON header every RocketMQ client sends: an object of
``code``, ``extFields`` (strings to strings), ``flag``, ``language``, ``opaque``, ``remark``, ``version`` and
scalar extras, read in one pass without building the intermediate dict.  ``json_header`` mirrors
``command.json_header``.  Any other shape (ROCKETMQ headers, numbers as strings, nested values, bad bytes,
non-string fields) goes to the reference, so lenient parsing and every FrameError stay in one place; the
differential fuzzers (``tests/differential.py``) hold both twins to the same answers.
"""

import json

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint8_t, uint32_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

from broker.remoting.codes import SerializeType
from broker.remoting.command import RemotingCommand
from store.format import native

cdef extern from "Python.h":
    object PyUnicode_FromKindAndData(int kind, const void* buffer, Py_ssize_t size)
    int PyUnicode_4BYTE_KIND
    int PyUnicode_1BYTE_KIND
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    bint PyUnicode_IS_ASCII(object)

_reference = native.TWINS["broker.remoting.command"].python
_JSON = SerializeType.JSON
_enc = json.encoder.encode_basestring


# --- decoding --------------------------------------------------------------------------------------------------

cdef struct Cursor:
    const uint8_t* s
    Py_ssize_t pos
    Py_ssize_t end


cdef inline void _ws(Cursor* c) noexcept nogil:
    while c.pos < c.end and (c.s[c.pos] == 32 or c.s[c.pos] == 9 or c.s[c.pos] == 10 or c.s[c.pos] == 13):
        c.pos += 1


cdef inline int _hex4(const uint8_t* p) noexcept nogil:
    """The value of 4 hex digits, -1 when one is not a hex digit."""
    cdef int v = 0, i, d
    for i in range(4):
        d = p[i]
        if 48 <= d <= 57:
            d -= 48
        elif 97 <= d <= 102:
            d -= 87
        elif 65 <= d <= 70:
            d -= 55
        else:
            return -1
        v = v * 16 + d
    return v


cdef object _string(Cursor* c):
    """A JSON string at ``c.pos`` (the opening quote), as CPython's strict scanner reads it; None otherwise."""
    cdef Py_ssize_t start = c.pos + 1, p = start
    cdef uint8_t ch
    cdef bint plain = True
    while p < c.end:
        ch = c.s[p]
        if ch == 34:
            break
        if ch == 92:
            plain = False
            p += 2
            continue
        if ch < 32:
            return None  # a control character: the strict scanner refuses it
        p += 1
    if p >= c.end:
        return None
    c.pos = p + 1
    if plain:
        try:
            return PyUnicode_DecodeUTF8(<const char*>c.s + start, p - start, NULL)
        except UnicodeDecodeError:
            return None
    return _escaped_ascii(c.s + start, p - start)


cdef object _escaped_ascii(const uint8_t* s, Py_ssize_t n):
    """A string body with escapes and only ASCII bytes (what the Java client writes for properties), into one
    code point buffer; anything else goes to :func:`_escaped`."""
    cdef Py_UCS4* out = <Py_UCS4*>malloc(n * sizeof(Py_UCS4) + 1)
    cdef Py_ssize_t i = 0, k = 0
    cdef int u, u2
    cdef uint8_t ch
    if out == NULL:
        raise MemoryError()
    try:
        while i < n:
            ch = s[i]
            if ch >= 128 or ch < 32:
                return _escaped(s, n)
            if ch != 92:
                out[k] = ch
                k += 1
                i += 1
                continue
            if i + 1 >= n:
                return None
            ch = s[i + 1]
            if ch == 117:
                if i + 6 > n:
                    return None
                u = _hex4(s + i + 2)
                if u < 0:
                    return None
                i += 6
                if 0xD800 <= u <= 0xDBFF and i + 1 < n and s[i] == 92 and s[i + 1] == 117:
                    if i + 6 > n:
                        return None
                    u2 = _hex4(s + i + 2)
                    if u2 < 0:
                        return None
                    if 0xDC00 <= u2 <= 0xDFFF:
                        u = 0x10000 + (((u - 0xD800) << 10) | (u2 - 0xDC00))
                        i += 6
                out[k] = u
            elif ch == 34 or ch == 92 or ch == 47:
                out[k] = ch
                i += 2
            elif ch == 98:
                out[k] = 8
                i += 2
            elif ch == 102:
                out[k] = 12
                i += 2
            elif ch == 110:
                out[k] = 10
                i += 2
            elif ch == 114:
                out[k] = 13
                i += 2
            elif ch == 116:
                out[k] = 9
                i += 2
            else:
                return None
            k += 1
        return PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, out, k)
    finally:
        free(out)


cdef object _escaped(const uint8_t* s, Py_ssize_t n):
    """A string body with backslash escapes: raw UTF-8 runs and escapes, surrogate pairs combined."""
    cdef Py_ssize_t i = 0, run
    cdef int u, u2
    cdef uint8_t ch
    cdef Py_UCS4 cp
    parts = []
    while i < n:
        run = i
        while i < n and s[i] != 92:
            if s[i] < 32:
                return None
            i += 1
        if i > run:
            try:
                parts.append(PyUnicode_DecodeUTF8(<const char*>s + run, i - run, NULL))
            except UnicodeDecodeError:
                return None
        if i >= n:
            break
        if i + 1 >= n:
            return None
        ch = s[i + 1]
        if ch == 117:  # \uXXXX
            if i + 6 > n:
                return None
            u = _hex4(s + i + 2)
            if u < 0:
                return None
            i += 6
            if 0xD800 <= u <= 0xDBFF and i + 1 < n and s[i] == 92 and s[i + 1] == 117:
                if i + 6 > n:
                    return None
                u2 = _hex4(s + i + 2)
                if u2 < 0:
                    return None
                if 0xDC00 <= u2 <= 0xDFFF:
                    u = 0x10000 + (((u - 0xD800) << 10) | (u2 - 0xDC00))
                    i += 6
            cp = u
            parts.append(PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, &cp, 1))
            continue
        if ch == 34:
            parts.append('"')
        elif ch == 92:
            parts.append("\\")
        elif ch == 47:
            parts.append("/")
        elif ch == 98:
            parts.append("\b")
        elif ch == 102:
            parts.append("\f")
        elif ch == 110:
            parts.append("\n")
        elif ch == 114:
            parts.append("\r")
        elif ch == 116:
            parts.append("\t")
        else:
            return None
        i += 2
    return "".join(parts)


cdef object _int(Cursor* c):
    """A JSON integer (``-?(0|[1-9][0-9]*)``, not followed by a fraction or an exponent, at most 18 characters);
    None otherwise."""
    cdef Py_ssize_t start = c.pos, p = c.pos
    if p < c.end and c.s[p] == 45:
        p += 1
    if p >= c.end or not (48 <= c.s[p] <= 57):
        return None
    if c.s[p] == 48:
        p += 1
    else:
        while p < c.end and 48 <= c.s[p] <= 57:
            p += 1
    if p < c.end and (c.s[p] == 46 or c.s[p] == 101 or c.s[p] == 69):
        return None
    if p - start > 18:
        return None  # past a long long; past 4,300 digits int() refuses: the reference decides
    c.pos = p
    return _small_int(c.s + start, p - start)


cdef inline object _small_int(const uint8_t* s, Py_ssize_t n):
    cdef long long v = 0
    cdef Py_ssize_t i = 1 if s[0] == 45 else 0
    while i < n:
        v = v * 10 + (s[i] - 48)
        i += 1
    return -v if s[0] == 45 else v


cdef bint _literal(Cursor* c, const char* word, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    if c.pos + n > c.end:
        return False
    for i in range(n):
        if c.s[c.pos + i] != <uint8_t>word[i]:
            return False
    c.pos += n
    return True


cdef bint _skip_scalar(Cursor* c) except -1:
    """Skip a string, an integer, true, false or null; False for anything else."""
    cdef uint8_t ch
    if c.pos >= c.end:
        return False
    ch = c.s[c.pos]
    if ch == 34:
        return _string(c) is not None
    if ch == 116:
        return _literal(c, "true", 4)
    if ch == 102:
        return _literal(c, "false", 5)
    if ch == 110:
        return _literal(c, "null", 4)
    return _int(c) is not None


cdef object _ext_fields(Cursor* c):
    """extFields: an object of string values (``null`` is an empty map, as in the reference); None otherwise."""
    cdef dict ext = {}
    if _literal(c, "null", 4):
        return ext
    if c.pos >= c.end or c.s[c.pos] != 123:
        return None
    c.pos += 1
    _ws(c)
    if c.pos < c.end and c.s[c.pos] == 125:
        c.pos += 1
        return ext
    while True:
        _ws(c)
        if c.pos >= c.end or c.s[c.pos] != 34:
            return None
        key = _string(c)
        if key is None:
            return None
        _ws(c)
        if c.pos >= c.end or c.s[c.pos] != 58:
            return None
        c.pos += 1
        _ws(c)
        if c.pos >= c.end or c.s[c.pos] != 34:
            return None  # a number, a boolean or null: the reference converts (or drops) it
        value = _string(c)
        if value is None:
            return None
        ext[key] = value
        _ws(c)
        if c.pos < c.end and c.s[c.pos] == 44:
            c.pos += 1
            continue
        if c.pos < c.end and c.s[c.pos] == 125:
            c.pos += 1
            return ext
        return None


cdef object _from_json(const uint8_t* s, Py_ssize_t n, object body):
    """The RemotingCommand of a plain JSON header, or None for the reference to decide."""
    cdef Cursor c
    c.s = s
    c.pos = 0
    c.end = n
    code = None
    language = "JAVA"
    version = 0
    opaque = 0
    flag = 0
    remark = None
    ext = {}
    if n == 0 or s[0] != 123:
        return None
    c.pos = 1
    _ws(&c)
    if c.pos < c.end and s[c.pos] == 125:
        return None  # no code: the reference raises
    while True:
        _ws(&c)
        if c.pos >= c.end or s[c.pos] != 34:
            return None
        key = _string(&c)
        if key is None:
            return None
        _ws(&c)
        if c.pos >= c.end or s[c.pos] != 58:
            return None
        c.pos += 1
        _ws(&c)
        if key == "code" or key == "flag" or key == "opaque" or key == "version":
            value = _int(&c)
            if value is None:
                return None
            if key == "code":
                code = value
            elif key == "flag":
                flag = value
            elif key == "opaque":
                opaque = value
            else:
                version = value
        elif key == "extFields":
            ext = _ext_fields(&c)
            if ext is None:
                return None
        elif key == "language":
            if c.pos >= c.end or s[c.pos] != 34:
                return None
            language = _string(&c)
            if language is None or language.isdigit():
                return None
        elif key == "remark":
            if _literal(&c, "null", 4):
                remark = None
            elif c.pos < c.end and s[c.pos] == 34:
                remark = _string(&c)
                if remark is None:
                    return None
            else:
                return None
        elif not _skip_scalar(&c):
            return None
        _ws(&c)
        if c.pos < c.end and s[c.pos] == 44:
            c.pos += 1
            continue
        if c.pos < c.end and s[c.pos] == 125:
            c.pos += 1
            break
        return None
    _ws(&c)
    if c.pos != c.end or code is None:
        return None
    return RemotingCommand(code, language, version, opaque, flag, remark, ext, body, _JSON)


def decode_frame(frame):
    """Mirrors ``command.decode_frame``."""
    cdef Py_buffer view
    cdef const uint8_t* s
    cdef uint32_t type_and_len
    cdef Py_ssize_t header_len
    try:
        PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    except (BufferError, TypeError):
        return _reference["decode_frame"](frame)
    try:
        s = <const uint8_t*>view.buf
        if view.len < 4:
            cmd = None
        else:
            type_and_len = (<uint32_t>s[0] << 24) | (<uint32_t>s[1] << 16) | (<uint32_t>s[2] << 8) | s[3]
            header_len = type_and_len & 0xFFFFFF
            if type_and_len >> 24 != 0 or header_len > view.len - 4:
                cmd = None
            else:
                body = PyBytes_FromStringAndSize(<const char*>s + 4 + header_len, view.len - 4 - header_len)
                cmd = _from_json(s + 4, header_len, body)
    finally:
        PyBuffer_Release(&view)
    if cmd is None:
        return _reference["decode_frame"](frame)
    return cmd


# --- encoding --------------------------------------------------------------------------------------------------

cdef struct Out:
    char* buf
    Py_ssize_t len
    Py_ssize_t cap


cdef int _grow(Out* o, Py_ssize_t more) except -1:
    cdef Py_ssize_t cap = o.cap
    cdef char* nb
    if o.len + more <= cap:
        return 0
    while cap < o.len + more:
        cap *= 2
    nb = <char*>realloc(o.buf, cap)
    if nb == NULL:
        raise MemoryError()
    o.buf = nb
    o.cap = cap
    return 0


cdef int _raw(Out* o, const char* p, Py_ssize_t n) except -1:
    _grow(o, n)
    memcpy(o.buf + o.len, p, n)
    o.len += n
    return 0


cdef int _str(Out* o, str v) except -1:
    """``encode_basestring(v)`` as UTF-8: a plain ASCII string is copied between quotes, anything else escaped by
    the json module as the reference does."""
    cdef Py_ssize_t n, i
    cdef const uint8_t* d
    cdef bytes enc
    if PyUnicode_IS_ASCII(v):
        n = PyUnicode_GET_LENGTH(v)
        d = <const uint8_t*>PyUnicode_DATA(v)
        for i in range(n):
            if d[i] < 32 or d[i] == 34 or d[i] == 92:
                break
        else:
            _grow(o, n + 2)
            o.buf[o.len] = 34
            memcpy(o.buf + o.len + 1, d, n)
            o.buf[o.len + n + 1] = 34
            o.len += n + 2
            return 0
    enc = _enc(v).encode()
    _raw(o, PyBytes_AS_STRING(enc), len(enc))
    return 0


cdef int _num(Out* o, object v) except -1:
    cdef bytes b = str(int(v)).encode()
    _raw(o, PyBytes_AS_STRING(b), len(b))
    return 0


def json_header(cmd):
    """Mirrors ``command.json_header``."""
    ext = cmd.ext_fields
    remark = cmd.remark
    language = cmd.language
    if type(ext) is not dict or type(language) is not str or (remark is not None and type(remark) is not str):
        return _reference["json_header"](cmd)
    for k, v in (<dict>ext).items():
        if type(k) is not str or type(v) is not str:
            return _reference["json_header"](cmd)  # _ext_value's conversions, or the error of a bad key
    cdef Out o
    o.cap = 512
    o.len = 0
    o.buf = <char*>malloc(o.cap)
    if o.buf == NULL:
        raise MemoryError()
    cdef bint first = True
    try:
        _raw(&o, b'{"code":', 8)
        _num(&o, cmd.code)
        _raw(&o, b',"extFields":{', 14)
        for k, v in (<dict>ext).items():
            if not first:
                _raw(&o, b",", 1)
            first = False
            _str(&o, k)
            _raw(&o, b":", 1)
            _str(&o, v)
        _raw(&o, b'},"flag":', 9)
        _num(&o, cmd.flag)
        _raw(&o, b',"language":', 12)
        _str(&o, language)
        _raw(&o, b',"opaque":', 10)
        _num(&o, cmd.opaque)
        if remark is not None:
            _raw(&o, b',"remark":', 10)
            _str(&o, remark)
        _raw(&o, b',"serializeTypeCurrentRPC":"JSON","version":', 44)
        _num(&o, cmd.version)
        _raw(&o, b"}", 1)
        return PyBytes_FromStringAndSize(o.buf, o.len)
    finally:
        free(o.buf)
