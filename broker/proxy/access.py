"""The plain ACL on the gRPC endpoint: RocketMQ 5 clients' signatures, checked against the broker's ``plain_acl.yml``
rules (``broker.acl``, the rules remoting requests are checked against).

A 5.x client's credentials provider signs each call in its metadata: ``x-mq-date-time`` (``yyyyMMddTHHmmssZ``) and
``authorization: MQv2-HMAC-SHA1 Credential=<AccessKey>[/...], SignedHeaders=x-mq-date-time, Signature=<hex>``, the
hex HmacSHA1 of the date-time under the secret key.  RocketMQ's proxy reads the hex as the bytes of the signature
and checks it as a remoting one (``AuthorizationHeader``), and so does this module: one HMAC, ``signed_by``.

The resources each request needs are the proxy's (``PlainAccessValidator.parse`` of a gRPC message): a topic to
send to (or end a transaction on) needs PUB, one to read from SUB, a route lookup any of them, a consumer group
SUB on the group; names are the broker's, with the client's namespace (``namespaces``).  A refusal is a
``ProxyError``: UNAUTHORIZED when the account is not established (unsigned, unknown access key, wrong signature),
FORBIDDEN when it lacks a permission; its message never holds a secret.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from broker.acl.access import Owned, Unauthenticated, authorize, retry_topic, signed_by
from broker.acl.manager import PlainAclManager
from broker.acl.rules import ANY, PUB, SUB
from broker.proxy import namespaces
from broker.proxy.status import Code, ProxyError
from broker.proxy.v2 import definition_pb2 as pb
from broker.proxy.v2 import service_pb2 as svc
from broker.remoting.errors import RequestRefused

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"


def parse_authorization(value: str) -> tuple[str, str]:
    """(access key, signature as base64) of an ``authorization`` value; ProxyError(UNAUTHORIZED) if it is not one
    a 5.x credentials provider writes."""
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise ProxyError(Code.UNAUTHORIZED, f"authorization: the algorithm is not {ALGORITHM}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, val = part.strip().partition("=")
        if sep:
            fields[key.strip()] = val.strip()
    access_key = fields.get("Credential", "").split("/", 1)[0]
    try:
        sig = base64.b64encode(bytes.fromhex(fields.get("Signature", ""))).decode("ascii")
    except ValueError:
        raise ProxyError(Code.UNAUTHORIZED, "authorization: the signature is not hexadecimal") from None
    return access_key, sig


def _group(needed: dict[str, int], resource: pb.Resource) -> None:
    if resource.name:
        needed[retry_topic(namespaces.wrap(resource))] = SUB


def _topic(needed: dict[str, int], resource: pb.Resource, perm: int) -> None:
    if resource.name:
        needed[namespaces.wrap(resource)] = perm


def resources(request: Any) -> dict[str, int]:
    """resource -> permission a request needs; groups as their retry topic (``%RETRY%group``), as remoting's."""
    needed: dict[str, int] = {}
    if isinstance(request, svc.SendMessageRequest):
        for m in request.messages:
            _topic(needed, m.topic, PUB)
    elif isinstance(request, svc.QueryRouteRequest):
        _topic(needed, request.topic, ANY)
    elif isinstance(request, svc.EndTransactionRequest | svc.RecallMessageRequest):
        _topic(needed, request.topic, PUB)
    elif isinstance(request, svc.HeartbeatRequest | svc.NotifyClientTerminationRequest
                    | svc.ChangeInvisibleDurationRequest):  # fmt: skip
        _group(needed, request.group)
    elif isinstance(request, svc.ReceiveMessageRequest | svc.PullMessageRequest | svc.UpdateOffsetRequest
                    | svc.GetOffsetRequest):  # fmt: skip
        _group(needed, request.group)
        _topic(needed, request.message_queue.topic, SUB)
    elif isinstance(request, svc.QueryOffsetRequest):
        _topic(needed, request.message_queue.topic, SUB)
    elif isinstance(request, svc.QueryAssignmentRequest | svc.AckMessageRequest
                    | svc.ForwardMessageToDeadLetterQueueRequest):  # fmt: skip
        _group(needed, request.group)
        _topic(needed, request.topic, SUB)
    elif isinstance(request, svc.TelemetryCommand) and request.HasField("settings"):
        settings = request.settings
        for topic in settings.publishing.topics:
            _topic(needed, topic, PUB)
        if settings.HasField("subscription"):
            _group(needed, settings.subscription.group)
            for entry in settings.subscription.subscriptions:
                _topic(needed, entry.topic, SUB)
    return needed


class GrpcAccess:
    """Checks gRPC calls against the broker's ACL manager (its rules as reloaded, at the time of each call)."""

    def __init__(self, acl: PlainAclManager) -> None:
        self.acl = acl

    def authenticate(self, metadata: Iterable[tuple[str, Any]], remote_ip: str) -> Owned | None:
        """The account that signed the call, None for a white-listed peer; ProxyError(UNAUTHORIZED) otherwise."""
        authorization = date_time = None
        for key, value in metadata:
            if key == AUTHORIZATION:
                authorization = str(value)
            elif key == DATE_TIME:
                date_time = str(value)
        access_key, sig = parse_authorization(authorization) if authorization is not None else (None, "")
        content = (date_time or "").encode("utf-8")
        try:
            return self.acl.rules.authenticate(access_key, remote_ip, lambda owned: signed_by(owned, content, sig))
        except Unauthenticated as e:
            raise ProxyError(Code.UNAUTHORIZED, e.remark) from None

    @staticmethod
    def authorize(owned: Owned | None, request: Any) -> None:
        """Pass when ``owned`` (None: a white-listed peer) holds what ``request`` needs; ProxyError(FORBIDDEN)
        naming the resource otherwise."""
        if owned is None:
            return
        try:
            authorize(owned, resources(request))
        except RequestRefused as e:
            raise ProxyError(Code.FORBIDDEN, e.remark) from None

    def check(self, metadata: Iterable[tuple[str, Any]], remote_ip: str, request: Any) -> None:
        self.authorize(self.authenticate(metadata, remote_ip), request)
