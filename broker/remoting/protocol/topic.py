"""Topic configs on the wire (``TopicConfig``, ``DataVersion``, ``TopicConfigSerializeWrapper``) and the
REGISTER_BROKER body that carries them (``RegisterBrokerBody``); also the permission and sys-flag bits.

One ``TopicConfig`` serves the broker's topic table (and topics.json), GET_ALL_TOPIC_CONFIG, the registration
body and the NameServer's view of a broker's topics.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from broker.remoting.protocol.wire import BodyError, WireModel

# PermName bits
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1

# TopicSysFlag bits
FLAG_UNIT = 0x1


class DataVersion(WireModel):
    """A broker's topic-table version: the NameServer re-reads the topics only when it changes."""

    counter: int = 0
    timestamp: int = 0
    state_version: int | None = None  # 5.x

    @field_validator("counter", mode="before")
    @classmethod
    def _atomic_long(cls, v: Any) -> Any:
        # fastjson writes an AtomicLong as a number; an object holding it is accepted as well.
        return v.get("value", 0) if isinstance(v, dict) else v

    def same_as(self, other: DataVersion | None) -> bool:
        """``DataVersion.equals``: timestamp, counter and (5.x) stateVersion match."""
        return other is not None and (self.timestamp, self.counter, self.state_version or 0) == (
            other.timestamp, other.counter, other.state_version or 0)  # fmt: skip


class TopicConfig(WireModel):
    """RocketMQ's ``TopicConfig``: the 4.x fields and 5.x's ``attributes`` (``message.type``, ...: see
    ``broker.server.attributes``), written only when a topic has some, as a 4.x broker reads the file too."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] | None = None

    @field_validator("attributes")
    @classmethod
    def _none_when_empty(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        return v or None

    def encode_line(self) -> str:
        """``TopicConfig.encode``: the space-separated line a compressed registration body carries."""
        return (
            f"{self.topic_name} {self.read_queue_nums} {self.write_queue_nums} {self.perm} {self.topic_filter_type}"
        )

    @classmethod
    def decode_line(cls, line: str) -> TopicConfig:
        """``TopicConfig.decode``: ``name readQ writeQ perm filterType [attributesJson]`` (attributes ignored)."""
        parts = line.split(" ", 5)
        if len(parts) < 5:
            raise BodyError(f"TopicConfig line {line!r} has fewer than 5 fields")
        try:
            return cls(topic_name=parts[0], read_queue_nums=int(parts[1]), write_queue_nums=int(parts[2]),
                       perm=int(parts[3]), topic_filter_type=parts[4])  # fmt: skip
        except ValueError as e:
            raise BodyError(f"TopicConfig line {line!r}: {e}") from None


class TopicConfigSerializeWrapper(WireModel):
    """A broker's whole topic table: GET_ALL_TOPIC_CONFIG's body, topics.json, and inside REGISTER_BROKER."""

    data_version: DataVersion = Field(default_factory=DataVersion)
    topic_config_table: dict[str, TopicConfig] = {}

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: Any) -> Any:
        # An entry without topicName is named by its key.
        table = data.get("topicConfigTable") if isinstance(data, dict) else None
        if isinstance(table, dict) and any(isinstance(c, dict) and not c.get("topicName") for c in table.values()):
            fixed = {k: {**c, "topicName": k} if isinstance(c, dict) and not c.get("topicName") else c
                     for k, c in table.items()}  # fmt: skip
            data = {**data, "topicConfigTable": fixed}
        return data

    def topics(self) -> dict[str, TopicConfig]:
        """The table keyed by each config's own topic name."""
        return {tc.topic_name: tc for tc in self.topic_config_table.values()}


class RegisterBrokerBody(WireModel):
    """REGISTER_BROKER's plain (uncompressed) body; the compressed form is decoded by the NameServer."""

    filter_server_list: list[str] = []
    topic_config_serialize_wrapper: TopicConfigSerializeWrapper = Field(default_factory=TopicConfigSerializeWrapper)

    @model_validator(mode="before")
    @classmethod
    def _bare_wrapper(cls, data: Any) -> Any:
        # Brokers older than 3.0.11 sent the wrapper itself.
        if isinstance(data, dict) and "topicConfigTable" in data and "topicConfigSerializeWrapper" not in data:
            return {"topicConfigSerializeWrapper": data}
        return data
