"""``WireModel``: the base of every JSON body — camelCase aliases, read as leniently as fastjson reads, written
as fastjson writes (fields sorted by name, nulls left out). A body that does not fit raises ``BodyError``, which
the remoting layer answers SYSTEM_ERROR with its message, as Java answers a body that does not decode.
"""

from __future__ import annotations

import types
from typing import Any, ClassVar, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, SerializationInfo, ValidationError, model_serializer, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from broker.remoting.errors import BodyError
from broker.remoting.protocol import fastjson

__all__ = ["BodyError", "WireModel", "describe"]


class WireModel(BaseModel):
    """A body as Java's fastjson exchanges it.

    Reading: a ``null`` field keeps its default (fastjson leaves the Java field as constructed), numbers are
    accepted for strings and numeric strings for numbers, unknown fields are ignored (other versions add some).
    Writing (``to_json``/``encode``): fields sorted by name and ``null`` ones left out, as fastjson writes a bean.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        coerce_numbers_to_str=True,
    )
    # Whether the body may carry JSON objects as map keys (``Map<MessageQueue, V>``): see fastjson.loads.
    object_keys: ClassVar[bool] = False

    @model_validator(mode="before")
    @classmethod
    def _nulls_keep_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and None in data.values():
            return {k: v for k, v in data.items() if v is not None}
        return data

    @model_serializer(mode="wrap")
    def _sorted_as_fastjson(self, handler: Any, info: SerializationInfo) -> Any:
        out = handler(self)
        if not isinstance(out, dict):
            return out
        out = self._as_written_by(out, info.context or {})
        return {k: out[k] for k in sorted(out)}

    def _as_written_by(self, out: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        """The fields as the RocketMQ version named in the serialization ``context`` wrote them (a model whose
        fields differ between versions says how); by default the written fields are the model's."""
        return out

    # --- in -------------------------------------------------------------------------------------------------
    @classmethod
    def decode(cls, body: bytes | str, source: str | None = None) -> Self:
        """A body's bytes (fastjson's dialect) as this model; BodyError naming ``source`` otherwise."""
        return cls.from_json(cls.load_json(body, source), source)

    @classmethod
    def load_json(cls, body: bytes | str, source: str | None = None) -> Any:
        """The JSON of a body as this model's bodies are written (object keys where they may be)."""
        name = source or cls.__name__
        try:
            text = str(body, "utf-8") if isinstance(body, bytes | bytearray | memoryview) else body
            if not text.strip():
                raise BodyError(f"{name} is empty")
            return fastjson.loads(text, name, object_keys=cls.object_keys)
        except (UnicodeDecodeError, ValueError) as e:
            if isinstance(e, BodyError):
                raise
            raise BodyError(f"{name} is not JSON: {getattr(e, 'detail', e)}") from None

    @classmethod
    def from_json(cls, data: Any, source: str | None = None) -> Self:
        """Parsed JSON as this model; BodyError naming ``source`` and the field otherwise."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise BodyError(f"{source or cls.__name__}: {describe(cls, e)}") from None

    # --- out ------------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The body as JSON-ready Python (integer map keys stay ints: the encoder decides how to write them)."""
        return self.model_dump(exclude_none=True)

    def encode(self) -> bytes:
        return fastjson.dumps(self.to_json())


def describe(model: type[BaseModel], error: ValidationError) -> str:
    """The first problem of a validation error, located as a path through the body, and how many more."""
    errors = error.errors(include_url=False)
    first = _describe_one(model, errors[0])
    return first if len(errors) == 1 else f"{first} (and {len(errors) - 1} more)"


def _describe_one(model: type[BaseModel], err: ErrorDetails) -> str:
    where = _path(model, err["loc"])
    got = err.get("input")
    shown = f" (got {got!r})" if not isinstance(got, dict | list) else ""
    return f"{where}: {err['msg']}{shown}" if where else f"{err['msg']}{shown}"


def _path(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """``('topicConfigTable', 'T', 'readQueueNums')`` -> ``topicConfigTable['T'].readQueueNums``: field names
    joined by dots, map keys and list indexes in brackets (told apart by walking the model's types)."""
    out = ""
    tp: Any = model
    for part in loc:
        tp = _non_optional(tp)
        field = _field(tp, part)
        if field is not None:
            out += f".{part}" if out else str(part)
            tp = field.annotation
            continue
        origin, args = get_origin(tp), get_args(tp)
        if part == "[key]":
            out += " (the key)"
        elif origin is dict and len(args) == 2:
            out += f"[{part!r}]"
            tp = args[1]
        elif origin in (list, tuple, set, frozenset) and args:
            out += f"[{part}]"
            tp = args[0]
        else:
            out += f"[{part!r}]"
            tp = Any
    return out


def _non_optional(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _field(tp: Any, part: int | str) -> FieldInfo | None:
    if not (isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str)):
        return None
    for name, info in tp.model_fields.items():
        if part in (name, info.alias):
            return info
    return None
