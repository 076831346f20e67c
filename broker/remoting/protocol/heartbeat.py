"""HEART_BEAT's body: ``HeartbeatData`` with its ``ProducerData``, ``ConsumerData`` and ``SubscriptionData``.

Java clients write enums by name, the C++ client by ordinal: both are read as the name.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_serializer, model_validator
from pydantic_core import PydanticUseDefault

from broker.remoting.protocol.wire import WireModel
from store.format import hashing

SUB_ALL = "*"
EXPRESSION_TYPE_TAG = "TAG"
EXPRESSION_TYPE_SQL92 = "SQL92"

CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY", "CONSUME_POP")
MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
CONSUME_FROM = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
)


def _enum_name(names: tuple[str, ...]) -> BeforeValidator:
    """A Java enum as its name: a name is kept (other versions add some), an ordinal is looked up; anything
    else (``""``, an ordinal out of range, another type) leaves the field's default."""

    def name(value: Any) -> str:
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
            return names[value]
        if isinstance(value, str) and value:
            return value
        raise PydanticUseDefault()

    return BeforeValidator(name)


def is_tag_type(expression_type: str | None) -> bool:
    """``ExpressionType.isTagType``: no type (old clients) or ``TAG``."""
    return not expression_type or expression_type == EXPRESSION_TYPE_TAG


def tag_codes(tags: list[str]) -> set[int]:
    """The ConsumeQueue tag codes (Java ``String.hashCode``) of tags."""
    return {hashing.java_string_hash(t) for t in tags}


class SubscriptionData(WireModel):
    """A consumer's subscription to one topic (``FilterAPI.buildSubscriptionData`` for TAG expressions)."""

    topic: str = ""
    sub_string: str = SUB_ALL
    tags_set: list[str] = []
    code_set: set[int] = set()
    sub_version: int = 0
    expression_type: str = EXPRESSION_TYPE_TAG
    class_filter_mode: bool = False

    @model_validator(mode="after")
    def _complete(self) -> SubscriptionData:
        # Some clients send only the expression, some tags without their codes. Any other expression type
        # (SQL92) is evaluated over properties by the broker: it names no tag.
        if not is_tag_type(self.expression_type):
            self.tags_set, self.code_set = [], set()
        elif not self.tags_set:
            self.sub_string = self.sub_string.strip() or SUB_ALL
            self.tags_set, self.code_set = parse_expression(self.sub_string)
        elif not self.code_set and SUB_ALL not in self.tags_set:
            self.code_set = tag_codes(self.tags_set)
        return self

    @classmethod
    def from_expression(cls, topic: str, expression: str | None, sub_version: int = 0) -> SubscriptionData:
        """``"*"``/empty = every message, else ``"a || b"`` tag alternatives."""
        return cls(topic=topic, sub_string=expression or SUB_ALL, sub_version=sub_version)

    @property
    def tag_codes(self) -> set[int] | None:
        """The ConsumeQueue tag codes to match, None for every message (and for an expression over properties)."""
        return _matched(self.tags_set, self.code_set)

    @field_serializer("code_set")
    def _sorted_codes(self, codes: set[int]) -> list[int]:
        return sorted(codes)


def parse_expression(expression: str | None) -> tuple[list[str], set[int]]:
    """A TAG expression's tags and their codes: ``"*"`` (or nothing) is no tag and no code, as Java's
    ``FilterAPI`` builds it (and sends it: ``"tagsSet":[]``)."""
    expr = (expression or "").strip()
    if not expr or expr == SUB_ALL:
        return [], set()
    tags = [t.strip() for t in expr.split("||") if t.strip()]
    return tags, tag_codes(tags)


def _matched(tags: list[str], codes: set[int]) -> set[int] | None:
    # No tag (Java's form of "*") or a "*" among them (some clients send it) is every message.
    return None if not tags or SUB_ALL in tags else codes


def expression_tag_codes(expression: str | None) -> set[int] | None:
    """The tag codes a pull's own expression matches, None for every message (no model: pulls run this)."""
    return _matched(*parse_expression(expression))


class ConsumerData(WireModel):
    group_name: str
    consume_type: Annotated[str, _enum_name(CONSUME_TYPES)] = "CONSUME_PASSIVELY"
    message_model: Annotated[str, _enum_name(MESSAGE_MODELS)] = "CLUSTERING"
    consume_from_where: Annotated[str, _enum_name(CONSUME_FROM)] = "CONSUME_FROM_LAST_OFFSET"
    subscription_data_set: list[SubscriptionData] = []
    unit_mode: bool = False


class ProducerData(WireModel):
    group_name: str = ""


class HeartbeatData(WireModel):
    client_id: str = Field(alias="clientID", min_length=1)
    producer_data_set: list[ProducerData] = []
    consumer_data_set: list[ConsumerData] = []
