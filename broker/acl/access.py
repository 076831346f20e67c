"""Checking one request against the ACL rules, as RocketMQ's ``PlainAccessValidator`` and
``PlainPermissionManager.validate`` do.

Order: a peer in ``globalWhiteRemoteAddresses`` passes; otherwise the request must carry an ``AccessKey`` of a
known account; a peer in that account's ``whiteRemoteAddress`` passes; otherwise the ``Signature`` must match
(see ``broker.remoting.signing``) and the account must hold the permission on every resource the request
touches (``resources``) and be ``admin`` for the admin codes. A refusal raises RequestRefused(NO_PERMISSION)
whose remark reads like RocketMQ's ``AclException`` messages and never holds a secret.

Deliberate differences from RocketMQ 4.9: the ACL admin codes (50-54) and the offset-reset, offset-clone and
expired-CommitLog deletion codes need ``admin`` too (RocketMQ lets any
account change the ACL); a send to a retry topic needs SUB on that retry topic's own group; QUERY_CONSUMER_OFFSET
needs what UPDATE_CONSUMER_OFFSET needs; SEND_BATCH_MESSAGE needs PUB as RocketMQ 5 checks it; VIEW_MESSAGE_BY_ID
needs SUB on the topic of the record it reads (the query processor checks it once it has read the record; RocketMQ
checks only the signature). Beyond the broker, mqlake's NameServer with ``aclEnable`` takes its write codes only
from ``admin`` accounts (``check_admin``).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from broker.acl.addresses import AddressPattern, compile_pattern
from broker.acl.rules import ANY, DENY, PUB, SUB, AclFile, parse_perm, parse_resource_perm
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestRefused
from broker.remoting.protocol.heartbeat import HeartbeatData
from broker.remoting.signing import ACCESS_KEY, SIGNATURE, signature, signed_values
from store.constants import RETRY_GROUP_TOPIC_PREFIX, TRACE_TOPIC, UNIQUE_MSG_QUERY_FLAG

MAX_ACCESS_KEY_LENGTH = 256  # longer ones are refused before any lookup
_NOT_SIGNED_BY_BROKER = frozenset({SIGNATURE, UNIQUE_MSG_QUERY_FLAG})  # what RocketMQ's validator leaves out

ADMIN_CODES = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_BROKER_CONFIG, RequestCode.DELETE_TOPIC_IN_BROKER,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.DELETE_SUBSCRIPTIONGROUP,
    RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, RequestCode.DELETE_ACL_CONFIG, RequestCode.GET_BROKER_CLUSTER_ACL_INFO,
    RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG,
    # operator actions that move offsets or delete data: RocketMQ 4.9 lets any signed account send them
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, RequestCode.CLONE_GROUP_OFFSET, RequestCode.DELETE_EXPIRED_COMMITLOG,
})  # fmt: skip


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def check_permission(needed: int, owned: int) -> bool:
    """``Permission.checkPermission``: DENY wins, ANY wants PUB or SUB, otherwise the bits must meet."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


class Unauthenticated(RequestRefused):
    """The request's account is not established: unsigned, an unknown access key or a wrong signature. Remoting
    answers it NO_PERMISSION as every refusal; the gRPC endpoint tells it apart (UNAUTHORIZED, not FORBIDDEN)."""

    def __init__(self, remark: str) -> None:
        super().__init__(ResponseCode.NO_PERMISSION, remark)


def _refuse(remark: str) -> RequestRefused:
    return RequestRefused(ResponseCode.NO_PERMISSION, remark)


def _show(name: str) -> str:
    return f"{name:.64}" + ("..." if len(name) > 64 else "")


# --- resources per request ---------------------------------------------------------------------------------------


def _add(needed: dict[str, int], resource: str | None, perm: int) -> None:
    if resource:
        needed[resource] = perm


def _send(needed: dict[str, int], topic: str | None) -> None:
    if topic is not None and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        _add(needed, topic, SUB)  # a consumer sending back to its own retry topic: the group's permission
    else:
        _add(needed, topic, PUB)


def resources(cmd: RemotingCommand) -> dict[str, int]:
    """resource -> permission the request needs; groups appear as their retry topic (``%RETRY%group``)."""
    ext = cmd.ext_fields
    needed: dict[str, int] = {}
    code = cmd.code
    if code == RequestCode.SEND_MESSAGE:
        _send(needed, ext.get("topic"))
    elif code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        _send(needed, ext.get("b"))
    elif code == RequestCode.RECALL_MESSAGE:  # taking back a message sent: the topic's PUB, as RocketMQ 5's
        _add(needed, ext.get("topic"), PUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        _add(needed, _retry(ext.get("group")), SUB)
    elif code in (RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE):  # one header, one processor
        _add(needed, ext.get("topic"), SUB)
        _add(needed, _retry(ext.get("consumerGroup")), SUB)
    elif code == RequestCode.QUERY_MESSAGE:
        _add(needed, ext.get("topic"), SUB)
    elif code == RequestCode.HEART_BEAT:
        try:
            data = HeartbeatData.decode(cmd.body, "heartbeat body")
        except ValueError as e:
            raise _refuse(f"cannot read the heartbeat body: {e}") from None
        for consumer in data.consumer_data_set:
            _add(needed, _retry(consumer.group_name), SUB)
            for sub in consumer.subscription_data_set:
                _add(needed, sub.topic, SUB)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        _add(needed, _retry(ext.get("consumerGroup")), SUB)
    elif code in (RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.QUERY_CONSUMER_OFFSET):
        _add(needed, _retry(ext.get("consumerGroup")), SUB)
        _add(needed, ext.get("topic"), SUB)
    return needed


def _retry(group: str | None) -> str | None:
    return retry_topic(group) if group else None


def _describe(resource: str) -> str:
    if resource.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return f"group:{_show(resource[len(RETRY_GROUP_TOPIC_PREFIX) :])}"
    return f"topic:{_show(resource)}"


# --- compiled rules ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Owned:
    """One account, compiled (``PlainAccessResource``)."""

    access_key: str
    secret_key: bytes = field(repr=False)  # UTF-8, as the signature uses it
    white: AddressPattern
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    perms: Mapping[str, int]  # topic, or %RETRY%group, -> perm bits


@dataclass(frozen=True, slots=True)
class Rules:
    """The rules of one version of the ACL file, ready to check requests against."""

    white: tuple[AddressPattern, ...]
    accounts: Mapping[str, Owned]

    @classmethod
    def compile(cls, acl: AclFile) -> Rules:
        accounts: dict[str, Owned] = {}
        for a in acl.accounts:
            perms: dict[str, int] = {}
            for item in a.group_perms:
                name, perm = parse_resource_perm(item)
                perms[retry_topic(name)] = perm
            for item in a.topic_perms:
                name, perm = parse_resource_perm(item)
                perms[name] = perm
            accounts[a.access_key] = Owned(
                a.access_key, a.secret_key.encode("utf-8"), compile_pattern(a.white_remote_address), a.admin,
                parse_perm(a.default_topic_perm), parse_perm(a.default_group_perm), perms,
            )  # fmt: skip
        return cls(tuple(acl.white_patterns()), accounts)

    def account(self, cmd: RemotingCommand, remote_ip: str) -> Owned | None:
        """The account that signed ``cmd``, None for a white-listed peer (nothing more is checked for it); raise
        Unauthenticated when the request is unsigned, of an unknown account or badly signed."""
        return self.authenticate(cmd.ext_fields.get(ACCESS_KEY), remote_ip, lambda owned: self._signed(cmd, owned))

    def authenticate(self, access_key: str | None, remote_ip: str, signed: Callable[[Owned], bool]) -> Owned | None:
        """The account of ``access_key`` once ``signed(account)`` confirmed the request's signature, None for a
        white-listed peer; raise Unauthenticated otherwise. Remoting and gRPC requests sign different content;
        each passes its own ``signed``, built on ``signed_by``."""
        for pattern in self.white:
            if pattern.matches(remote_ip):
                return None
        if not access_key:
            raise Unauthenticated("No accessKey is configured")
        if len(access_key) > MAX_ACCESS_KEY_LENGTH:
            raise Unauthenticated(f"AccessKey of {len(access_key)} characters is longer than {MAX_ACCESS_KEY_LENGTH}")
        owned = self.accounts.get(access_key)
        if owned is None:
            raise Unauthenticated(f"No acl config for {_show(access_key)}")
        if owned.white.matches(remote_ip):
            return None
        if not signed(owned):
            raise Unauthenticated(f"Check signature failed for accessKey={access_key}")
        return owned

    def check(self, cmd: RemotingCommand, remote_ip: str, needed: Mapping[str, int] | None = None) -> None:
        """Pass, or raise RequestRefused(NO_PERMISSION) saying why (never with a secret). ``needed``: the
        resources and permissions to check instead of what the request names (``resources``), for a handler
        that learns its topic only from what it reads."""
        owned = self.account(cmd, remote_ip)
        if owned is None:
            return
        authorize(owned, resources(cmd) if needed is None else needed, cmd.code if cmd.code in ADMIN_CODES else None)

    def check_admin(self, cmd: RemotingCommand, remote_ip: str) -> None:
        """Pass a request signed by an ``admin`` account (or from a white-listed peer), or raise
        RequestRefused(NO_PERMISSION): how mqlake's NameServer guards its write codes."""
        owned = self.account(cmd, remote_ip)
        if owned is not None:
            authorize(owned, {}, cmd.code)

    @staticmethod
    def _signed(cmd: RemotingCommand, owned: Owned) -> bool:
        given = cmd.ext_fields.get(SIGNATURE)
        if given is None:
            return False
        # The broker leaves _UNIQUE_KEY_QUERY out of the content (RocketMQ's validator does) while a client's
        # hook signs it: either form is accepted, both under the account's secret.
        if signed_by(owned, signed_values(cmd.ext_fields, _NOT_SIGNED_BY_BROKER), given, cmd.body):
            return True
        unique = UNIQUE_MSG_QUERY_FLAG in cmd.ext_fields
        return unique and signed_by(owned, signed_values(cmd.ext_fields), given, cmd.body)


def signed_by(owned: Owned, content: bytes, given: str, body: bytes = b"") -> bool:
    """Whether ``given`` (base64) is the account's signature of ``content`` + ``body`` (``signing.signature``)."""
    expected = signature(content, owned.secret_key, body)
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace"))


def authorize(owned: Owned, needed: Mapping[str, int], admin_code: int | None = None) -> None:
    """Pass when ``owned`` holds every permission of ``needed`` (and is ``admin`` when ``admin_code``, the code of
    an admin request, is given); raise RequestRefused(NO_PERMISSION) naming the first resource it lacks."""
    if needed.get(TRACE_TOPIC) == PUB:
        return  # message traces are written whatever the account holds, as RocketMQ does
    if admin_code is not None and not owned.admin:
        raise _refuse(f"Need admin permission for request code={admin_code}, but accessKey={owned.access_key} is not")
    if not needed or (owned.admin and not owned.perms):
        return
    for resource, perm in needed.items():
        is_group = resource.startswith(RETRY_GROUP_TOPIC_PREFIX)
        held = owned.perms.get(resource)
        if held is None:
            held = owned.default_group_perm if is_group else owned.default_topic_perm
        if not check_permission(perm, held):
            raise _refuse(f"No default permission for {_describe(resource)}")
