"""RemotingCommand: one frame of the RocketMQ remoting protocol, with both header encodings (reference §7.1–7.2).

Frame: ``int length`` (excluding itself) | ``byte serializeType`` + ``24-bit header length`` | header | body.
The JSON header is fastjson of Java's RemotingCommand (keys in fastjson's alphabetical order); the ROCKETMQ
header is the binary ``RocketMQSerializable`` layout. Decoding accepts both and is lenient about JSON shapes
other clients produce (numbers as strings and vice versa, language as name or number, missing fields).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from broker.remoting.codes import CURRENT_VERSION, FLAG_ONEWAY, FLAG_RESPONSE, LanguageCode, SerializeType
from broker.remoting.errors import FrameError, HeaderError
from broker.remoting.headers import Header
from store.config_files import load_lenient_json
from store.format import native

__all__ = ["FrameError", "HeaderError", "RemotingCommand"]

H = TypeVar("H", bound=Header)

_PREFIX = struct.Struct(">iI")  # frame length, serialize type << 24 | header length
_TYPE_AND_LEN = struct.Struct(">I")
_BIN_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
_BIN_HEAD = struct.Struct(">hBhiii")  # the same, then the remark length
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">H")
_HEADER_LEN_MAX = 0xFFFFFF

_enc = json.encoder.encode_basestring  # JSON string literal, non-ASCII kept as UTF-8 like fastjson
# JSONDecoder sets scan_once in __init__ (the C scanner); typeshed does not declare it.  Called directly, it
# skips raw_decode's Python frame on every request.
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_LANGUAGE_BY_NUMBER = {lc.value: lc.name for lc in LanguageCode}


def _ext_value(value: Any) -> str:
    # Java writes Map<String,String>; other clients may send JSON numbers or booleans.
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value) if isinstance(value, dict | list) else str(value)


def _language_name(value: Any) -> str:
    """Some clients send the LanguageCode ordinal instead of its name."""
    try:
        return _LANGUAGE_BY_NUMBER.get(int(value), "OTHER")
    except (TypeError, ValueError):
        return "OTHER"


def _short(value: int) -> int:
    return ((value + 0x8000) & 0xFFFF) - 0x8000


def _int_field(obj: dict[str, Any], key: str, default: int | None) -> int:
    value = obj.get(key, default)
    if type(value) is int:
        return value
    if value is None:
        raise FrameError(f"JSON header has no {key!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise FrameError(f"JSON header field {key!r} is not an integer: {value!r}") from None


@dataclass(slots=True)
class RemotingCommand:
    code: int
    language: str = "PYTHON"  # LanguageCode name, as the JSON header carries it
    version: int = CURRENT_VERSION
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    @classmethod
    def request(
        cls,
        code: int,
        header: Header | None = None,
        body: bytes = b"",
        *,
        oneway: bool = False,
        ext: dict[str, str] | None = None,
    ) -> RemotingCommand:
        """A request; the opaque is assigned when it is sent."""
        ext_fields = header.to_ext() if header is not None else {}
        if ext:
            ext_fields.update(ext)
        return cls(code=int(code), flag=FLAG_ONEWAY if oneway else 0, ext_fields=ext_fields, body=body)

    def response(
        self,
        code: int = 0,
        remark: str | None = None,
        header: Header | None = None,
        body: bytes = b"",
        ext: dict[str, str] | None = None,
    ) -> RemotingCommand:
        """The answer to this request: same opaque, response flag, the request's serialize type."""
        ext_fields = header.to_ext() if header is not None else {}
        if ext:
            ext_fields.update(ext)
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=ext_fields,
            body=body,
            serialize_type=self.serialize_type,
        )

    def read_header(self, cls: type[H]) -> H:
        """The typed custom header; raises HeaderError naming a missing or unparseable field."""
        return cls.from_ext(self.ext_fields)

    # --- encoding ----------------------------------------------------------------------------------------------

    def _binary_header(self) -> bytes:
        try:
            language = LanguageCode[self.language].value
        except KeyError:
            language = LanguageCode.OTHER.value
        # Java casts code and version to short; wrap the same way instead of failing on e.g. POP codes.
        parts = [_BIN_FIXED.pack(_short(self.code), language, _short(self.version), self.opaque, self.flag)]
        remark = self.remark.encode("utf-8") if self.remark else b""
        parts.append(_INT.pack(len(remark)))
        parts.append(remark)
        ext: list[bytes] = []
        for key, value in self.ext_fields.items():
            if value is None:
                continue
            k = key.encode("utf-8")
            v = str(value).encode("utf-8")
            ext += (_SHORT.pack(len(k)), k, _INT.pack(len(v)), v)
        ext_bytes = b"".join(ext)
        parts.append(_INT.pack(len(ext_bytes)))
        parts.append(ext_bytes)
        return b"".join(parts)

    def encode_parts(self) -> tuple[bytes, bytes]:
        """(length prefix + header, body): lets a writer send a large body without copying it."""
        if self.serialize_type == SerializeType.ROCKETMQ:
            header = self._binary_header()
        elif self.serialize_type == SerializeType.JSON:
            header = json_header(self)
        else:
            raise FrameError(f"cannot encode serialize type {self.serialize_type!r}")
        if len(header) > _HEADER_LEN_MAX:
            raise FrameError(f"header of {len(header)} bytes exceeds the 24-bit header length")
        length = 4 + len(header) + len(self.body)
        return _PREFIX.pack(length, (int(self.serialize_type) << 24) | len(header)) + header, self.body

    def encode(self) -> bytes:
        """The whole frame including the 4-byte length prefix."""
        head, body = self.encode_parts()
        return head + body if body else head

    # --- decoding ----------------------------------------------------------------------------------------------

    @classmethod
    def decode(cls, frame: bytes | bytearray | memoryview) -> RemotingCommand:
        """Decode one frame given WITHOUT its length prefix; raises FrameError when it is malformed."""
        return decode_frame(frame)

    @classmethod
    def _from_json(cls, header: bytes | bytearray | memoryview) -> RemotingCommand:
        try:
            text = str(header, "utf-8")
            obj, end = _scan_json(text, 0)
            if end != len(text) and text[end:].strip():
                raise ValueError("trailing data")
        except (ValueError, StopIteration):  # UnicodeDecodeError is a ValueError
            try:
                # fastjson may write integer map keys unquoted
                obj = load_lenient_json(str(header, "utf-8"), "remoting JSON header")
            except ValueError as e:
                raise FrameError(f"unparsable JSON header: {e}; header starts {bytes(header[:80])!r}") from None
        if not isinstance(obj, dict):
            raise FrameError(f"JSON header is not an object: {bytes(header[:80])!r}")
        language = obj.get("language", "JAVA")
        if type(language) is not str or language.isdigit():
            language = _language_name(language)
        ext = obj.get("extFields")
        if ext is None:
            ext = {}
        elif not isinstance(ext, dict):
            raise FrameError(f"JSON header extFields is not an object: {ext!r:.80}")
        if not all(type(v) is str for v in ext.values()):
            ext = {str(k): _ext_value(v) for k, v in ext.items() if v is not None}
        remark = obj.get("remark")
        return cls(
            code=_int_field(obj, "code", None),
            language=language,
            version=_int_field(obj, "version", 0),
            opaque=_int_field(obj, "opaque", 0),
            flag=_int_field(obj, "flag", 0),
            remark=remark if remark is None or isinstance(remark, str) else str(remark),
            ext_fields=ext,
            serialize_type=SerializeType.JSON,
        )

    @classmethod
    def _from_binary(cls, header: bytes) -> RemotingCommand:
        size = len(header)
        if size < _BIN_HEAD.size + 4:
            raise FrameError(f"ROCKETMQ header of {size} bytes is shorter than its fixed part")
        code, language, version, opaque, flag, remark_len = _BIN_HEAD.unpack_from(header, 0)
        pos = _BIN_HEAD.size
        if remark_len < 0 or pos + remark_len + 4 > size:
            raise FrameError(f"ROCKETMQ header: remark length {remark_len} at byte {pos - 4} runs past the header")
        remark = header[pos : pos + remark_len].decode("utf-8", "replace") if remark_len > 0 else None
        pos += remark_len
        (ext_len,) = _INT.unpack_from(header, pos)
        pos += 4
        ext_end = pos + ext_len
        if ext_len < 0 or ext_end > size:
            raise FrameError(f"ROCKETMQ header: extFields length {ext_len} at byte {pos - 4} runs past the header")
        ext: dict[str, str] = {}
        while pos < ext_end:
            entry = pos
            if pos + 2 <= ext_end:
                (key_len,) = _SHORT.unpack_from(header, pos)
                pos += 2 + key_len
                if pos + 4 <= ext_end:
                    (value_len,) = _INT.unpack_from(header, pos)
                    if 0 <= value_len <= ext_end - pos - 4:
                        key = header[entry + 2 : pos].decode("utf-8", "replace")
                        pos += 4 + value_len
                        ext[key] = header[pos - value_len : pos].decode("utf-8", "replace")
                        continue
            raise FrameError(f"ROCKETMQ header: extFields entry at byte {entry} runs past the extFields end")
        return cls(
            code=code,
            language=_LANGUAGE_BY_NUMBER.get(language, "OTHER"),
            version=version,
            opaque=opaque,
            flag=flag,
            remark=remark,
            ext_fields=ext,
            serialize_type=SerializeType.ROCKETMQ,
        )


# Module-level so that each has a compiled twin (broker/remoting/_command.pyx, chosen by store.format.native).


def decode_frame(frame: bytes | bytearray | memoryview) -> RemotingCommand:
    """:meth:`RemotingCommand.decode`: one frame WITHOUT its length prefix; FrameError when it is malformed."""
    size = len(frame)
    if size < 4:
        raise FrameError(f"frame of {size} bytes is shorter than its 4-byte header length field")
    (type_and_len,) = _TYPE_AND_LEN.unpack_from(frame, 0)
    serialize = type_and_len >> 24
    header_len = type_and_len & _HEADER_LEN_MAX
    if header_len > size - 4:
        raise FrameError(f"header length {header_len} is larger than the frame ({size - 4} bytes after it)")
    header = frame[4 : 4 + header_len]
    body = bytes(frame[4 + header_len :])
    if serialize == 0:  # SerializeType.JSON; plain ints, this runs per request
        cmd = RemotingCommand._from_json(header)
    elif serialize == 1:  # SerializeType.ROCKETMQ
        cmd = RemotingCommand._from_binary(bytes(header))
    else:
        raise FrameError(f"unknown serialize type {serialize} (expected 0 JSON or 1 ROCKETMQ)")
    cmd.body = body
    return cmd


def json_header(cmd: RemotingCommand) -> bytes:
    """The JSON header of ``cmd``, assembled by hand in fastjson's key order (twice as fast as json.dumps)."""
    ext = ",".join([_enc(k) + ":" + _enc(v if type(v) is str else _ext_value(v)) for k, v in cmd.ext_fields.items()])
    remark = "" if cmd.remark is None else ',"remark":' + _enc(cmd.remark)
    return (
        f'{{"code":{int(cmd.code)},"extFields":{{{ext}}},"flag":{int(cmd.flag)},'
        f'"language":{_enc(cmd.language)},"opaque":{int(cmd.opaque)}{remark},'
        f'"serializeTypeCurrentRPC":"JSON","version":{int(cmd.version)}}}'
    ).encode()


native.install(globals(), "broker.remoting._command", ("decode_frame", "json_header"))
