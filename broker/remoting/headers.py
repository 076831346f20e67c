"""Typed custom headers: the ``extFields`` of a command as dataclasses named after RocketMQ's Java classes.

A header class declares fields in snake_case; the wire keys are the Java field names (camelCase, computed, or
given with ``java_name``). Fields without a default are required, as ``@CFNotNull`` is in Java. Values travel as
strings: ints in decimal, bools as ``true``/``false`` (Java ``Boolean.parseBoolean``: anything else is false).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self, dataclass_transform

from broker.remoting.errors import HeaderError

__all__ = ["Header", "HeaderError", "java_name"]


def java_name(name: str, default: Any = None) -> Any:
    """A field whose wire key is not the camelCase of its attribute name (e.g. ``clientID``)."""
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata={"java": name})
    return dataclasses.field(default=default, metadata={"java": name})


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _parse_bool(value: str) -> bool:
    return value.lower() == "true"


_PARSERS: dict[type, Callable[[str], Any]] = {str: str, int: int, bool: _parse_bool, float: float}


@dataclasses.dataclass(frozen=True, slots=True)
class _Spec:
    attr: str
    key: str
    parse: Callable[[str], Any]
    type_name: str
    required: bool


def _base_type(annotation: Any) -> type:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else None
    if annotation not in _PARSERS:
        raise TypeError(f"header fields must be str, int, bool or float (optionally | None), not {annotation!r}")
    return annotation


@dataclass_transform(kw_only_default=True)
class Header:
    """Base of every custom header: subclasses become keyword-only dataclasses."""

    _specs: ClassVar[tuple[_Spec, ...]] = ()
    # Set on each subclass by the dataclass decorator below; declared so that type checkers know it.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(kw_only=True)(cls)
        hints = typing.get_type_hints(cls)
        specs = []
        for f in dataclasses.fields(cls):
            base = _base_type(hints[f.name])
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            key = f.metadata.get("java") or _camel(f.name)
            specs.append(_Spec(f.name, key, _PARSERS[base], base.__name__, required))
        cls._specs = tuple(specs)

    @classmethod
    def from_ext(cls, ext: Mapping[str, str] | None) -> Self:
        """Parse ``extFields``; unknown keys are ignored, a missing required field raises HeaderError."""
        ext = ext or {}
        values: dict[str, Any] = {}
        for spec in cls._specs:
            raw = ext.get(spec.key)
            if raw is None:
                if spec.required:
                    raise HeaderError(f"the custom field <{spec.key}> is null")
                continue
            try:
                values[spec.attr] = spec.parse(raw)
            except (TypeError, ValueError):
                raise HeaderError(
                    f"the custom field <{spec.key}> of {cls.__name__} is not a valid {spec.type_name}: {raw!r}"
                ) from None
        return cls(**values)

    def to_ext(self) -> dict[str, str]:
        """The non-None fields as ``extFields`` strings."""
        out: dict[str, str] = {}
        for spec in self._specs:
            value = getattr(self, spec.attr)
            if value is None:
                continue
            kind = type(value)
            # inlined _format: this runs for every field of every request the client sends
            out[spec.key] = value if kind is str else ("true" if value else "false") if kind is bool else str(value)
        return out


# --- name server (reference §7.5) -------------------------------------------------------------------------------


class GetRouteInfoRequestHeader(Header):
    topic: str
    accept_standard_json_only: bool | None = None


class RegisterBrokerRequestHeader(Header):
    broker_name: str
    broker_addr: str
    cluster_name: str
    ha_server_addr: str
    broker_id: int
    heartbeat_timeout_millis: int | None = None
    enable_acting_master: bool | None = None
    compressed: bool = False
    body_crc32: int = 0


class RegisterBrokerResponseHeader(Header):
    ha_server_addr: str | None = None
    master_addr: str | None = None


class UnRegisterBrokerRequestHeader(Header):
    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: int


class QueryDataVersionRequestHeader(Header):
    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: int


class QueryDataVersionResponseHeader(Header):
    changed: bool


class GetTopicsByClusterRequestHeader(Header):
    cluster: str


class DeleteTopicFromNamesrvRequestHeader(Header):
    topic: str
    cluster_name: str | None = None


class WipeWritePermOfBrokerRequestHeader(Header):
    broker_name: str


class WipeWritePermOfBrokerResponseHeader(Header):
    wipe_topic_count: int


class GetKVConfigRequestHeader(Header):
    namespace: str
    key: str


class GetKVConfigResponseHeader(Header):
    value: str | None = None


class PutKVConfigRequestHeader(Header):
    namespace: str
    key: str
    value: str


class DeleteKVConfigRequestHeader(Header):
    namespace: str
    key: str


# --- send (reference §7.6) --------------------------------------------------------------------------------------


class SendMessageRequestHeader(Header):
    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str | None = None
    reconsume_times: int | None = None
    unit_mode: bool = False
    batch: bool = False
    max_reconsume_times: int | None = None
    broker_name: str | None = None


# V2 short name -> V1 attribute; the V2 header is the same data with one-letter keys to shrink every send frame.
_V2_TO_V1 = {
    "a": "producer_group",
    "b": "topic",
    "c": "default_topic",
    "d": "default_topic_queue_nums",
    "e": "queue_id",
    "f": "sys_flag",
    "g": "born_timestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsume_times",
    "k": "unit_mode",
    "l": "max_reconsume_times",
    "m": "batch",
    "n": "broker_name",
}


class SendMessageRequestHeaderV2(Header):
    a: str
    b: str
    c: str
    d: int
    e: int
    f: int
    g: int
    h: int
    i: str | None = None
    j: int | None = None
    k: bool | None = None
    l: int | None = None  # noqa: E741 - the wire key is "l"
    m: bool | None = None
    n: str | None = None

    def to_v1(self) -> SendMessageRequestHeader:
        values = {v1: getattr(self, v2) for v2, v1 in _V2_TO_V1.items()}
        values["unit_mode"] = bool(values["unit_mode"])
        values["batch"] = bool(values["batch"])
        return SendMessageRequestHeader(**values)

    @classmethod
    def from_v1(cls, v1: SendMessageRequestHeader) -> SendMessageRequestHeaderV2:
        return cls(**{v2: getattr(v1, attr) for v2, attr in _V2_TO_V1.items()})

    @classmethod
    def read_v1(cls, ext: Mapping[str, str]) -> SendMessageRequestHeader:
        """``from_ext(ext).to_v1()`` without the intermediate header: this runs on every send.

        Any missing or unparseable field falls back to the generic path, so the HeaderError is the same.
        """
        try:
            get = ext.get
            j, k, m, l_ = get("j"), get("k"), get("m"), get("l")
            return SendMessageRequestHeader(
                producer_group=ext["a"],
                topic=ext["b"],
                default_topic=ext["c"],
                default_topic_queue_nums=int(ext["d"]),
                queue_id=int(ext["e"]),
                sys_flag=int(ext["f"]),
                born_timestamp=int(ext["g"]),
                flag=int(ext["h"]),
                properties=get("i"),
                reconsume_times=None if j is None else int(j),
                unit_mode=k is not None and k.lower() == "true",
                batch=m is not None and m.lower() == "true",
                max_reconsume_times=None if l_ is None else int(l_),
                broker_name=get("n"),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return cls.from_ext(ext).to_v1()


class SendMessageResponseHeader(Header):
    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
    batch_uniq_id: str | None = None
    recall_handle: str | None = None


class RecallMessageRequestHeader(Header):
    producer_group: str | None = None
    topic: str
    recall_handle: str


class RecallMessageResponseHeader(Header):
    msg_id: str


# --- pull and offsets (reference §7.7, §7.9) --------------------------------------------------------------------


class PullMessageRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_millis: int
    subscription: str | None = None
    sub_version: int
    expression_type: str | None = None
    max_msg_bytes: int | None = None
    request_source: int | None = None
    proxy_froward_client_id: str | None = None  # sic: "Froward" is the Java field name


class PullMessageResponseHeader(Header):
    suggest_which_broker_id: int
    next_begin_offset: int
    min_offset: int
    max_offset: int
    offset_delta: int | None = None  # 5.x
    topic_sys_flag: int | None = None
    group_sys_flag: int | None = None
    forbidden_type: int | None = None


class QueryConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    set_zero_if_not_found: bool | None = None


class QueryConsumerOffsetResponseHeader(Header):
    offset: int


class UpdateConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int


class GetMaxOffsetRequestHeader(Header):
    topic: str
    queue_id: int
    committed: bool | None = None


class GetMaxOffsetResponseHeader(Header):
    offset: int


class GetMinOffsetRequestHeader(Header):
    topic: str
    queue_id: int


class GetMinOffsetResponseHeader(Header):
    offset: int


class GetEarliestMsgStoretimeRequestHeader(Header):
    topic: str
    queue_id: int


class GetEarliestMsgStoretimeResponseHeader(Header):
    timestamp: int


class SearchOffsetRequestHeader(Header):
    topic: str
    queue_id: int
    timestamp: int
    boundary_type: str | None = None


class SearchOffsetResponseHeader(Header):
    offset: int


class QueryMessageRequestHeader(Header):
    topic: str
    key: str
    max_num: int
    begin_timestamp: int
    end_timestamp: int


class QueryMessageResponseHeader(Header):
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


class ViewMessageRequestHeader(Header):
    offset: int
    topic: str | None = None


# --- client management (reference §7.8, §7.9) -------------------------------------------------------------------


class GetConsumerListByGroupRequestHeader(Header):
    consumer_group: str


class UnregisterClientRequestHeader(Header):
    client_id: str = java_name("clientID", dataclasses.MISSING)
    producer_group: str | None = None
    consumer_group: str | None = None


class NotifyConsumerIdsChangedRequestHeader(Header):
    consumer_group: str


class ConsumerSendMsgBackRequestHeader(Header):
    offset: int
    group: str
    delay_level: int
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None


class EndTransactionRequestHeader(Header):
    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    from_transaction_check: bool = False
    msg_id: str
    transaction_id: str | None = None
    topic: str | None = None


class CheckTransactionStateRequestHeader(Header):
    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None
    topic: str | None = None
    broker_name: str | None = None


class GetConsumerRunningInfoRequestHeader(Header):
    consumer_group: str
    client_id: str
    jstack_enable: bool = False


# --- admin -------------------------------------------------------------------------------------------------------


class CreateTopicRequestHeader(Header):
    topic: str
    default_topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_filter_type: str
    topic_sys_flag: int | None = None
    order: bool = False
    attributes: str | None = None
    force: bool | None = None


class DeleteTopicRequestHeader(Header):
    topic: str


class DeleteSubscriptionGroupRequestHeader(Header):
    group_name: str
    clean_offset: bool = False


class GetTopicStatsInfoRequestHeader(Header):
    topic: str


class GetConsumeStatsRequestHeader(Header):
    consumer_group: str
    topic: str | None = None


class GetConsumerConnectionListRequestHeader(Header):
    consumer_group: str


class GetProducerConnectionListRequestHeader(Header):
    producer_group: str


class QueryTopicConsumeByWhoRequestHeader(Header):
    topic: str


class ResetOffsetRequestHeader(Header):
    topic: str
    group: str
    timestamp: int
    is_force: bool


class GetBrokerConfigResponseHeader(Header):
    version: str


class BrokerHeartbeatRequestHeader(Header):
    cluster_name: str
    broker_addr: str
    broker_name: str
    broker_id: int | None = None
    epoch: int | None = None
    max_offset: int | None = None
    confirm_offset: int | None = None
    heartbeat_timeout_mills: int | None = None
    election_priority: int | None = None


# --- plain ACL admin codes 50-54 ---------------------------------------------------------------------------------


class CreateAccessConfigRequestHeader(Header):
    access_key: str
    secret_key: str | None = None
    white_remote_address: str | None = None
    admin: bool = False
    default_topic_perm: str | None = None
    default_group_perm: str | None = None
    topic_perms: str | None = None  # ","-joined name=PERM
    group_perms: str | None = None


class DeleteAccessConfigRequestHeader(Header):
    access_key: str


class UpdateGlobalWhiteAddrsConfigRequestHeader(Header):
    global_white_addrs: str  # ","-joined patterns
    acl_file_full_path: str | None = None


class GetBrokerAclConfigResponseHeader(Header):
    version: str
    all_acl_file_version: str | None = None
    broker_name: str
    broker_addr: str
    cluster_name: str
