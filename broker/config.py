"""``broker.conf``: Java properties with RocketMQ's key names -> (BrokerConfig, MessageStoreConfig).

One file configures both the broker (``BrokerConfig``) and its store (``MessageStoreConfig``), as in
RocketMQ; each key goes to whichever model knows it. RocketMQ ignores unknown keys silently, which hides typos:
here each is logged with the known key it resembles, and one resembling a durability or security key stops
start-up (unless ``strictConfig=false``). A value that does not fit its key is an error naming both.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from broker.tls_config import TlsConfig
from lake.objectstore import ObjectStoreError, lake_location
from store.config import RUNTIME, SAFETY, BrokerRole, MessageStoreConfig, _camel, keys_where
from store.constants import DEFAULT_BROKER_NAME, DEFAULT_CLUSTER, DEFAULT_REGION_ID
from store.errors import MQLakeError

log = logging.getLogger(__name__)

DEFAULT_STORE_DIR = Path(".mqlake/store")  # mqlake's default; RocketMQ's is ~/store

# Spellings RocketMQ 4.x used before the "maped" typo was fixed, and other 4.x names 5.x renamed.
_LEGACY_KEYS = {
    "mapedFileSizeCommitLog": "mappedFileSizeCommitLog",
    "mapedFileSizeConsumeQueue": "mappedFileSizeConsumeQueue",
    "haSlaveFallbehindMax": "haMaxGapNotInSync",  # 4.9's name
}


class BrokerConfigError(MQLakeError, ValueError):
    """A broker.conf that cannot be used; the message names the file and the key."""


class InnerCredentials(BaseModel):
    """The account a server signs its own requests with (RocketMQ 5's ``innerClientAuthenticationCredentials``,
    JSON ``{"accessKey": ..., "secretKey": ...}``); the secret never shows in ``repr``."""

    model_config = ConfigDict(alias_generator=_camel, populate_by_name=True, extra="forbid", frozen=True)

    access_key: str = Field(min_length=1)
    secret_key: str = Field(min_length=1, repr=False)

    @classmethod
    def parse(cls, value: object) -> object:
        """A JSON text (as broker.conf holds it) -> its fields; anything else is left to the model's validation."""
        if not isinstance(value, str):
            return value
        if not value.strip():
            return None
        try:
            return json.loads(value)
        except ValueError:
            # the text holds a secret: say what is wrong without echoing it
            raise ValueError('not JSON of the form {"accessKey":"...","secretKey":"..."}') from None


class AclSettings(BaseModel):
    """The keys that switch RocketMQ's plain ACL on (the broker's, and mqlake's NameServer's): ``aclEnable`` reads
    ``{rocketmqHome}/conf/plain_acl.yml``."""

    model_config = ConfigDict(alias_generator=_camel, populate_by_name=True, extra="forbid", validate_assignment=True)

    # Safety settings: honoured, or start-up stops naming the key (never ignored with a warning).
    acl_enable: Annotated[bool, SAFETY] = False
    rocketmq_home: str | None = Field(default_factory=lambda: os.environ.get("ROCKETMQ_HOME") or None)

    @model_validator(mode="after")
    def _acl_home(self) -> Self:
        if self.acl_enable and not self.rocketmq_home:
            raise ValueError("aclEnable=true needs rocketmqHome (or ROCKETMQ_HOME) to find conf/plain_acl.yml")
        return self

    @property
    def acl_file(self) -> Path:
        """``{rocketmqHome}/conf/plain_acl.yml``."""
        return Path(self.rocketmq_home or ".") / "conf" / "plain_acl.yml"


class ConfigChecks(BaseModel):
    """How a config file's keys are checked. ``strictConfig=false`` lets a broker start with a key that looks like
    a misspelled durability or security key (only a warning then)."""

    model_config = ConfigDict(alias_generator=_camel, populate_by_name=True, extra="forbid")

    strict_config: bool = True


class NamesrvConfig(AclSettings, ConfigChecks):
    """``mqlake namesrv -c``: the NameServer's keys. With ``aclEnable`` its write codes need a signed admin account
    of plain_acl.yml (mqlake's; RocketMQ 4.x's NameServer checks nothing).  With ``enableControllerInNamesrv`` it
    also runs a single-node controller for brokers in controller mode (``broker.namesrv.replicas_controller``) on
    ``controllerListenPort`` (0: the OS picks), its state in ``controllerStorePath``; ``scanNotActiveBrokerInterval``
    is how often it looks for a dead master (RocketMQ's ControllerConfig names and defaults)."""

    tls: TlsConfig = Field(default_factory=TlsConfig, exclude=True)
    enable_controller_in_namesrv: bool = False
    controller_listen_port: int = Field(9878, ge=0, le=65535)
    controller_store_path: Path = Field(default_factory=lambda: Path.home() / "DledgerController")
    scan_not_active_broker_interval: int = Field(5000, ge=100)


class BrokerConfig(AclSettings, ConfigChecks):
    """The ``BrokerConfig`` settings mqlake acts on (RocketMQ names as aliases)."""

    broker_cluster_name: str = Field(DEFAULT_CLUSTER, min_length=1)
    broker_name: str = Field(DEFAULT_BROKER_NAME, min_length=1)
    broker_id: int = Field(0, ge=0)
    broker_ip1: str = Field("127.0.0.1", alias="brokerIP1", min_length=1)
    listen_port: int = Field(10911, ge=0, le=65535)
    namesrv_addr: str | None = None  # ';'-separated host:port list
    broker_permission: Annotated[int, RUNTIME] = Field(6, ge=0, le=15)
    auto_create_topic_enable: Annotated[bool, RUNTIME] = True
    auto_create_subscription_group: Annotated[bool, RUNTIME] = True
    default_topic_queue_nums: Annotated[int, RUNTIME] = Field(8, ge=1, le=1024)
    cluster_topic_enable: bool = True
    broker_topic_enable: bool = True
    long_polling_enable: Annotated[bool, RUNTIME] = True
    short_polling_time_mills: Annotated[int, RUNTIME] = Field(1000, ge=1)
    lite_pull_message_enable: bool = True  # LITE_PULL_MESSAGE (361) served, as Java's default
    flush_consumer_offset_interval: int = Field(5000, ge=10)
    register_name_server_period: int = Field(30_000, ge=1000)
    channel_expired_timeout: Annotated[int, RUNTIME] = Field(120_000, ge=1000)  # a client silent this long is dropped
    enable_property_filter: bool = False  # SQL92 subscriptions (off by default, as in RocketMQ)
    reject_transaction_message: bool = False  # refuse half messages with NO_PERMISSION
    transaction_time_out: int = Field(6000, ge=0)  # ms a half message waits before its first check-back
    transaction_check_max: int = Field(15, ge=0)  # check-backs before it moves to TRANS_CHECK_MAX_TIME_TOPIC
    transaction_check_interval: int = Field(30_000, ge=10)  # ms between check rounds (5.x's default)
    notify_consumer_ids_changed_enable: Annotated[bool, RUNTIME] = True
    # Replication: a slave copies the master's config tables this often (mqlake's key; RocketMQ 4.x: fixed 10 s).
    slave_sync_interval: int = Field(10_000, ge=100)
    slave_read_enable: bool = False  # the master may suggest the slave to consumers that fall far behind
    region_id: Annotated[str, RUNTIME] = DEFAULT_REGION_ID
    trace_on: Annotated[bool, RUNTIME] = True
    # Signs the broker's own requests (registrations with the NameServers, a slave's requests to its master) as
    # RocketMQ 5's broker does: needed when they have aclEnable=true. Kept out of GET_BROKER_CONFIG: a secret.
    inner_client_authentication_credentials: Annotated[InnerCredentials | None, SAFETY] = Field(
        None, exclude=True, repr=False
    )
    enable_dleger_commit_log: bool = Field(False, alias="enableDLegerCommitLog")
    # Controller mode (RocketMQ 5's BrokerConfig names and defaults, docs/ha.md): the controllers elect the master;
    # brokerRole and brokerId are then the controller's to decide (the broker starts as a slave).
    enable_controller_mode: Annotated[bool, SAFETY] = False
    controller_addr: str | None = None  # ';'-separated host:port list
    sync_broker_metadata_period: int = Field(5_000, ge=10)
    sync_controller_metadata_period: int = Field(10_000, ge=10)
    check_sync_state_set_period: int = Field(5_000, ge=10)
    broker_heartbeat_interval: int = Field(1_000, ge=10)
    controller_heart_beat_timeout_mills: int = Field(10_000, ge=100)
    broker_election_priority: int = Field(2**31 - 1, ge=0)  # lower is preferred; Java's default Integer.MAX_VALUE
    tls: TlsConfig = Field(default_factory=TlsConfig, exclude=True)
    # Metrics (RocketMQ 5's exporter settings; mqlake exports PROM only: /metrics over HTTP)
    metrics_exporter_type: Literal["DISABLE", "PROM"] = "DISABLE"
    metrics_prom_exporter_host: str = ""  # empty: brokerIP1, as RocketMQ
    metrics_prom_exporter_port: int = Field(5557, ge=0, le=65535)
    metrics_label: str = ""  # extra labels on every metric: "k1:v1,k2:v2"
    # mqlake: also log to rotating files here (broker.log, namesrv.log), as RocketMQ's ~/logs/rocketmqlogs
    log_dir: Path | None = None
    # mqlake: the Delta lake root the tier job writes (messages, segments, ...). Set, the broker serves reads
    # below a queue's local minimum from it, `mqlake up` runs the tier job at deleteWhen, and the metrics
    # report the newest tier/verify-index/replay run from its _reports/; unset, none of these.
    # A directory or s3://bucket/prefix (lake/objectstore.py: settings from the AWS environment variables).
    lake_path: Path | str | None = None
    lake_cache_bytes: int = Field(256 * 1024 * 1024, ge=0)  # decoded row groups of the tier kept in memory
    # The RocketMQ 5 gRPC endpoint (broker.proxy, docs/grpc.md): a proxy in local mode in the broker process, off
    # unless enableProxy=true; RocketMQ's ProxyConfig names and defaults for the port and the invisible-time bounds.
    enable_proxy: bool = False
    grpc_server_port: int = Field(8081, ge=0, le=65535)
    min_invisible_time_mills_for_recv: int = Field(10_000, ge=1000)
    max_invisible_time_mills: int = Field(12 * 3600 * 1000, ge=1000)
    # A send whose message type (normal, FIFO, delay, transaction) is not its topic's message.type attribute is
    # refused, on remoting and gRPC, as RocketMQ 5's proxy refuses it. Off by default (the proxy's is on): topics
    # made by 4.x tools carry no type and count as NORMAL, so a 4.x client's delayed or ordered sends would fail.
    enable_topic_message_type_check: bool = False
    # RECALL_MESSAGE (and gRPC RecallMessage) write a timer message's delete mark; off by default, as in RocketMQ
    # 5.4 (refused with NO_PERMISSION). A timer send answers its recall handle either way.
    recall_message_enable: bool = False

    @field_validator("lake_path", mode="before")
    @classmethod
    def _lake_location(cls, v: object) -> Path | str | None:
        if v is None or v == "":
            return None
        if not isinstance(v, str | os.PathLike):
            raise ValueError(f"lakePath {v!r}: expected a directory or s3://bucket/prefix")
        try:
            return lake_location(v)
        except ObjectStoreError as e:
            raise ValueError(str(e)) from None

    @field_validator("enable_dleger_commit_log")
    @classmethod
    def _dleger(cls, v: bool) -> bool:
        if v:
            raise ValueError("enableDLegerCommitLog=true is not supported: mqlake has no DLedger (Raft) CommitLog")
        return v

    @model_validator(mode="after")
    def _controllers(self) -> Self:
        if self.enable_controller_mode:
            addrs = self.controller_addrs
            if not addrs:
                raise ValueError("enableControllerMode=true needs controllerAddr (host:port;host:port;...)")
            for a in addrs:
                host, _, port = a.rpartition(":")
                if not host or not port.isdigit() or not 0 < int(port) < 65536:
                    raise ValueError(f"controllerAddr={self.controller_addr!r}: {a!r} is not host:port")
        return self

    @property
    def controller_addrs(self) -> list[str]:
        return [a.strip() for a in (self.controller_addr or "").split(";") if a.strip()]

    @field_validator("inner_client_authentication_credentials", mode="before")
    @classmethod
    def _credentials(cls, v: object) -> object:
        return InnerCredentials.parse(v)

    @property
    def broker_addr(self) -> str:
        return f"{self.broker_ip1}:{self.listen_port}"

    @property
    def namesrv_addrs(self) -> list[str]:
        return [a.strip() for a in (self.namesrv_addr or "").split(";") if a.strip()]


# =====================================================================================================
# Java properties
# =====================================================================================================

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(s: str, source: str, line_no: int) -> str:
    out = []
    i = 0
    while i < len(s):
        c = s[i]
        if c != "\\" or i + 1 >= len(s):
            out.append(c)
            i += 1
            continue
        nxt = s[i + 1]
        if nxt == "u":
            digits = s[i + 2 : i + 6]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise BrokerConfigError(f"{source}:{line_no}: malformed \\uxxxx escape {s[i : i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
    return "".join(out)


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first physical line number, logical line) with continuations joined, comments and blanks dropped."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start = i
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        # An odd number of trailing backslashes continues the line; leading blanks of the next are dropped.
        while (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            line = line[:-1]
            if i >= len(lines):
                break
            line += lines[i].lstrip(" \t\f")
            i += 1
        yield start + 1, line


def parse_properties(text: str, source: str = "<string>") -> dict[str, str]:
    """``java.util.Properties.load``: ``key=value``, ``key: value`` or ``key value``; later keys win."""
    props: dict[str, str] = {}
    for line_no, line in _logical_lines(text):
        i = 0
        while i < len(line):
            c = line[i]
            if c == "\\":
                i += 2
                continue
            if c in "=: \t\f":
                break
            i += 1
        key = line[:i]
        # After the key: blanks, at most one '=' or ':', blanks; the rest is the value.
        rest = line[i:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        props[_unescape(key, source, line_no)] = _unescape(rest, source, line_no)
    return props


# =====================================================================================================
# broker.conf
# =====================================================================================================


def _aliases(model: type[BaseModel]) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


# Durability and security keys: a misspelling of one of these would leave the setting at its default (ASYNC_FLUSH
# for SYNC_FLUSH, no ACL, no TLS) without anyone noticing, so it stops start-up. Every tls.* key is a security key.
SAFETY_KEYS = keys_where(BrokerConfig, "safety") | keys_where(MessageStoreConfig, "safety") | _aliases(TlsConfig)


def known_keys() -> set[str]:
    """Every broker.conf key mqlake reads (broker, store and tls.* settings, and the 4.x spellings it maps)."""
    models = (_aliases(BrokerConfig) - {"tls"}) | (_aliases(MessageStoreConfig) - {"storeHost"}) | _aliases(TlsConfig)
    return models | set(_LEGACY_KEYS)


def closest_key(key: str, known: set[str] | frozenset[str]) -> str | None:
    """The known key ``key`` most likely misspells (case ignored), or None when none is close."""
    by_lower = {k.lower(): k for k in known}
    match = difflib.get_close_matches(key.lower(), by_lower, n=1, cutoff=0.8)
    return by_lower[match[0]] if match else None


def check_unknown_keys(unknown: list[str], known: set[str], source: str, strict: bool) -> None:
    """Warn about each key no model knows, naming the known key it resembles. A key that resembles a durability or
    security key raises BrokerConfigError (one line naming each such key and its suggestion) unless not ``strict``:
    RocketMQ ignores unknown keys, so a typo there silently weakens the broker."""
    refused = []
    for key in unknown:
        match = closest_key(key, known)
        if match is None:
            log.warning("%s: unknown key %r ignored", source, key)
        elif match in SAFETY_KEYS and strict:
            refused.append(f"unknown key {key!r} (did you mean {match!r}?)")
        else:
            log.warning("%s: unknown key %r ignored (did you mean %r?)", source, key, match)
    if refused:
        raise BrokerConfigError(
            f"{source}: " + "; ".join(refused) + ": a durability or security setting would stay at its default; "
            "fix the key, or set strictConfig=false to start anyway"
        )


def _error(source: str, err: ValidationError, values: dict[str, str] | dict[str, object]) -> BrokerConfigError:
    problems = []
    for e in err.errors():
        key = str(e["loc"][0]) if e["loc"] else "?"
        msg = e["msg"].removeprefix("Value error, ")
        if len(e["loc"]) > 1:  # a field inside a structured value: name it
            msg = ".".join(str(p) for p in e["loc"][1:]) + ": " + msg
        if not e["loc"]:  # a check across keys: its message names them
            problems.append(msg)
        elif "password" in key.lower() or "credentials" in key.lower():  # never echo a secret
            problems.append(f"invalid value for {key}: {msg}")
        else:
            problems.append(f"invalid value for {key}={values.get(key, '')!r}: {msg}")
    return BrokerConfigError(f"{source}: " + "; ".join(problems))


def load_tls(values: dict[str, str], source: str = "<tls config>") -> TlsConfig:
    """The ``tls.*`` keys of a properties file as a TlsConfig; BrokerConfigError naming the key otherwise."""
    try:
        return TlsConfig(**values)
    except ValidationError as e:
        raise _error(source, e, values) from None


def build_configs(
    values: Mapping[str, object], source: str = "<broker.conf>"
) -> tuple[BrokerConfig, MessageStoreConfig]:
    """Split RocketMQ-named settings between the broker and the store; warn on keys neither knows (and stop on one
    that looks like a misspelled durability or security key, see :func:`check_unknown_keys`)."""
    broker_keys, store_keys = _aliases(BrokerConfig) - {"tls"}, _aliases(MessageStoreConfig) - {"storeHost"}
    tls_keys = _aliases(TlsConfig)
    broker_values: dict[str, object] = {}
    store_values: dict[str, object] = {}
    tls_values: dict[str, str] = {}
    unknown = []
    for raw_key, value in values.items():
        key = _LEGACY_KEYS.get(raw_key, raw_key)
        if key in tls_keys:
            tls_values[key] = str(value)
        elif key in broker_keys:
            broker_values[key] = value
        elif key in store_keys:
            store_values[key] = value
        else:
            unknown.append(raw_key)
    try:
        checks = ConfigChecks.model_validate({k: v for k, v in broker_values.items() if k == "strictConfig"})
    except ValidationError as e:
        raise _error(source, e, broker_values) from None
    check_unknown_keys(unknown, known_keys(), source, checks.strict_config)
    broker_values["tls"] = load_tls(tls_values, source)
    try:
        broker = BrokerConfig(**broker_values)
    except ValidationError as e:
        raise _error(source, e, broker_values) from None
    store_values.setdefault("storePathRootDir", DEFAULT_STORE_DIR)
    # Every record carries the broker's address; it is the offset message id's prefix too.
    store_values["storeHost"] = broker.broker_addr
    try:
        store = MessageStoreConfig(**store_values)
    except ValidationError as e:
        raise _error(source, e, store_values) from None
    # As BrokerStartup: a master is brokerId 0 whatever the file says; a slave needs an id of its own.  In
    # controller mode the controllers decide both: the broker starts as a slave with the id they give it.
    if broker.enable_controller_mode:
        store.broker_role = BrokerRole.SLAVE
    elif store.broker_role == BrokerRole.SLAVE:
        if broker.broker_id == 0:
            raise BrokerConfigError(f"{source}: brokerRole=SLAVE needs brokerId > 0 (0 is the master's id)")
    elif broker.broker_id != 0:
        log.warning("%s: brokerRole=%s: brokerId %d ignored, a master is 0", source, store.broker_role,
                    broker.broker_id)  # fmt: skip
        broker.broker_id = 0
    return broker, store


def load_broker_conf(
    path: str | os.PathLike[str] | None, overrides: Mapping[str, object | None] | None = None
) -> tuple[BrokerConfig, MessageStoreConfig]:
    """Read a broker.conf (None: all defaults) into (BrokerConfig, MessageStoreConfig): the one loader of the
    broker, the CLI, the pipelines and the DAGs.

    ``overrides`` are settings under their broker.conf keys that win over the file (the command-line flags:
    ``--host`` is ``brokerIP1``, ``--port`` ``listenPort``, ``--store-dir`` ``storePathRootDir``, ``--lake``
    ``lakePath``); a None value leaves the file's. They are checked as the file's values are, and the address
    written into every record (``storeHost``) follows them.
    """
    values: dict[str, object] = {}
    source = "<defaults>"
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            text = p.read_text(encoding="latin-1")  # Properties.load(InputStream) reads ISO-8859-1
        except OSError as e:
            raise BrokerConfigError(f"{p}: cannot read broker config: {e.strerror or e}") from None
        values.update(parse_properties(text, source))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return build_configs(values, source)


def load_namesrv_conf(path: str | os.PathLike[str] | None) -> NamesrvConfig:
    """Read ``mqlake namesrv -c``'s properties file (None: all defaults): the ``tls.*`` keys, ``aclEnable`` and
    ``rocketmqHome``; other keys are logged and ignored."""
    if path is None:
        return NamesrvConfig()
    p = Path(path)
    try:
        text = p.read_text(encoding="latin-1")
    except OSError as e:
        raise BrokerConfigError(f"{p}: cannot read NameServer config: {e.strerror or e}") from None
    values = parse_properties(text, str(p))
    tls_keys, own_keys = _aliases(TlsConfig), _aliases(NamesrvConfig) - {"tls"}
    own: dict[str, object] = {k: v for k, v in values.items() if k in own_keys}
    try:
        checks = ConfigChecks.model_validate({k: v for k, v in own.items() if k == "strictConfig"})
    except ValidationError as e:
        raise _error(str(p), e, own) from None
    check_unknown_keys(sorted(set(values) - tls_keys - own_keys), tls_keys | own_keys, str(p), checks.strict_config)
    own["tls"] = load_tls({k: v for k, v in values.items() if k in tls_keys}, str(p))
    try:
        return NamesrvConfig(**own)
    except ValidationError as e:
        raise _error(str(p), e, own) from None
