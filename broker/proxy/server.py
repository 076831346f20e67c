"""``GrpcProxy``: the grpc.aio server of the v2 endpoint, on the broker's event loop (enableProxy, grpcServerPort).

Started after the broker (it serves from the open store) and stopped before it: in-flight RPCs get a grace
period, parked receives answer at once, and the pop state is already in the CommitLog.  A gRPC message larger than
maxMessageSize plus room for the envelope is refused by gRPC itself (RESOURCE_EXHAUSTED) before it is decoded;
a body over maxMessageSize within that room gets MESSAGE_BODY_TOO_LARGE.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

from broker.proxy.access import GrpcAccess
from broker.proxy.pop import PopService
from broker.proxy.service import Malformed, MessagingService, Refused, peer_ip
from broker.proxy.status import Code, ProxyError, status
from broker.proxy.v2 import definition_pb2 as pb
from broker.proxy.v2 import service_pb2 as svc
from broker.tls_config import TlsConfig
from store.errors import MQLakeError

if TYPE_CHECKING:
    from broker.server.controller import BrokerController

log = logging.getLogger(__name__)

ENVELOPE_ROOM = 64 * 1024  # properties, topic and the other fields around a body of maxMessageSize


class ProxyPortError(MQLakeError, OSError):
    """grpcServerPort cannot be listened on."""


class ProxyTlsError(MQLakeError, ValueError):
    """A ``tls.server.*`` file the gRPC port cannot use; the message names it."""


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials | None:
    """The gRPC port's TLS from the broker's ``tls.server.*`` keys: TLS only in ``enforcing`` mode.  gRPC cannot
    take plaintext and TLS on one port, so ``permissive`` serves plaintext (as ``disabled``)."""
    if tls.server_mode != "enforcing" or tls.server_cert_path is None or tls.server_key_path is None:
        if tls.server_mode == "permissive":
            log.warning("tls.server.mode=permissive: the gRPC port serves plaintext only (gRPC cannot mix both)")
        return None

    def read(path: Path) -> bytes:
        try:
            return path.read_bytes()
        except OSError as e:
            raise ProxyTlsError(f"gRPC proxy: cannot read {path}: {e.strerror}") from None

    key = read(tls.server_key_path)
    if tls.server_key_password:  # gRPC takes an unencrypted key: decrypted here, in memory only
        from cryptography.hazmat.primitives import serialization

        try:
            loaded = serialization.load_pem_private_key(key, tls.server_key_password.encode())
        except (ValueError, TypeError) as e:
            raise ProxyTlsError(f"gRPC proxy: {tls.server_key_path}: {e}") from None
        key = loaded.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption())  # fmt: skip
    asks = tls.server_need_client_auth != "none" and tls.server_trust_cert_path is not None
    trust = read(tls.server_trust_cert_path) if asks and tls.server_trust_cert_path is not None else None
    return grpc.ssl_server_credentials([(key, read(tls.server_cert_path))], root_certificates=trust,
                                       require_client_auth=tls.server_need_client_auth == "require")  # fmt: skip


class ProxyRoleError(MQLakeError, ValueError):
    """enableProxy on a broker that cannot serve it: a slave outside controller mode (pop state and sends are
    written to the CommitLog, and such a slave never becomes master)."""


class GrpcProxy:
    """The endpoint of one broker.  ``check`` (the role, the TLS files) runs before the broker opens anything;
    ``start`` (the port, served at once) runs once the store is open and before the broker registers
    (``BrokerController.start(before_register=...)``), so a refused start never appears to the cluster.  With
    ``aclEnable`` every call is checked against the broker's plain ACL (``access``).

    In controller mode it serves whatever the broker's role: as a slave it answers routes (naming the master) and
    refuses what would write to the CommitLog; its pop service runs while the broker is master, started when the
    controllers elect it and stopped when they make it a slave."""

    def __init__(self, broker: BrokerController, host: str | None = None) -> None:
        self.broker = broker
        self.host = host or broker.host
        self.pop = PopService(broker)
        self.service = MessagingService(broker, self.pop)
        limit = broker.store_config.max_message_size + ENVELOPE_ROOM
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                               ("grpc.so_reuseport", 0)])  # fmt: skip
        self.port = 0
        self._credentials: grpc.ServerCredentials | None = None
        self._checked = False

    def check(self) -> None:
        """Raise ProxyRoleError or ProxyTlsError when the endpoint cannot serve; nothing is opened."""
        if self.broker.is_slave and not self.broker.config.enable_controller_mode:
            raise ProxyRoleError("enableProxy=true on a SLAVE: the gRPC endpoint writes sends and pop checkpoints "
                                 "to the CommitLog, which only the master does; enable it on the master (or run "
                                 "the brokers in controller mode: there it follows the role)")  # fmt: skip
        self._credentials = server_credentials(self.broker.config.tls)
        self._checked = True

    async def start(self) -> None:
        if not self._checked:
            self.check()
        acl = self.broker.acl  # loaded by the broker's start: the rules remoting requests are checked against
        self.server.add_generic_rpc_handlers((handlers(self.service, GrpcAccess(acl) if acl is not None else None),))
        if not self.broker.is_slave:
            await self.pop.start()
        self.broker.role_listeners.append(self._role_changed)
        port = self.broker.config.grpc_server_port
        try:
            if self._credentials is None:
                self.port = self.server.add_insecure_port(f"{self.host}:{port}")
            else:
                self.port = self.server.add_secure_port(f"{self.host}:{port}", self._credentials)
        except RuntimeError as e:  # grpcio's "Failed to bind": the port is taken
            self.port = 0
            log.error("gRPC proxy: %s", e)
        if self.port == 0:
            self.broker.role_listeners.remove(self._role_changed)
            await self.pop.stop()
            raise ProxyPortError(f"gRPC proxy: cannot listen on {self.host}:{port} (grpcServerPort): in use?")
        if port == 0:
            self.broker.config.grpc_server_port = self.port
        await self.server.start()
        log.debug("gRPC proxy (apache.rocketmq.v2.MessagingService) serving on %s:%d", self.host, self.port)

    async def _role_changed(self, master: bool) -> None:
        if master:
            await self.pop.start()
        else:
            await self.pop.stop()  # parked receives answer now; a slave's revive would write to its CommitLog

    async def stop(self, grace: float = 2.0) -> None:
        if self._role_changed in self.broker.role_listeners:
            self.broker.role_listeners.remove(self._role_changed)
        await self.pop.stop()
        await self.server.stop(grace)
        await self.service.route.close()
        log.info("gRPC proxy stopped")


def _lenient(cls: Any) -> Callable[[bytes], Any]:
    """The request decoder: bytes that are no ``cls`` become a ``Malformed`` the RPC answers BAD_REQUEST to."""

    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as e:
            return Malformed(f"malformed {cls.DESCRIPTOR.name} ({len(data)} bytes): {e}")

    return decode


def _failed(method: str, response: Any) -> Any:
    """A bug (an exception the RPC did not turn into a status): logged, and answered INTERNAL_SERVER_ERROR."""
    log.exception("gRPC %s failed", method)
    return response(status=status(Code.INTERNAL_SERVER_ERROR, f"{method} failed inside the broker: see its log"))


def _refusal(request: Any, context: Any, access: GrpcAccess | None) -> pb.Status | None:
    """The status a request is refused with before its RPC runs: its signature or permissions (with the ACL on),
    then its bytes; None when it goes on."""
    try:
        owned = access.authenticate(context.invocation_metadata() or (), peer_ip(context)) if access else None
        if isinstance(request, Malformed):
            return status(Code.BAD_REQUEST, request.reason)
        if access is not None:
            access.authorize(owned, request)
    except ProxyError as e:
        return status(e.code, e.message)
    return None


def _refusing(fn: Callable[..., Any], response: Any, streaming: bool, access: GrpcAccess | None) -> Callable[..., Any]:
    """``fn``, except that a request refused by the ACL or Malformed is answered with ``response(status=...)``
    and an unexpected exception with INTERNAL_SERVER_ERROR (never an UNKNOWN gRPC error without a v2 status)."""
    if streaming:

        @functools.wraps(fn)
        async def stream(request: Any, context: Any) -> Any:
            refused = _refusal(request, context, access)
            if refused is not None:
                yield response(status=refused)
                return
            started = False
            try:
                async for item in fn(request, context):
                    started = True
                    yield item
            except Exception:
                if started:  # a status was already sent: the stream just ends, in error
                    raise
                yield _failed(fn.__name__, response)

        return stream

    @functools.wraps(fn)
    async def unary(request: Any, context: Any) -> Any:
        refused = _refusal(request, context, access)
        if refused is not None:
            return response(status=refused)
        try:
            return await fn(request, context)
        except Exception:
            return _failed(fn.__name__, response)

    return unary


def _checked_telemetry(fn: Callable[..., Any], access: GrpcAccess) -> Callable[..., Any]:
    """The Telemetry stream with the ACL on: its signature checked when it opens (a refusal is its one command),
    each command's permissions as it arrives (a refused one is answered with its status, and not acted on)."""

    @functools.wraps(fn)
    async def telemetry(request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        try:
            owned = access.authenticate(context.invocation_metadata() or (), peer_ip(context))
        except ProxyError as e:
            yield svc.TelemetryCommand(status=status(e.code, e.message))
            return

        async def checked() -> AsyncIterator[Any]:
            async for cmd in request_iterator:
                if not isinstance(cmd, Malformed):
                    try:
                        access.authorize(owned, cmd)
                    except ProxyError as e:
                        cmd = Refused(e.code, e.message)
                yield cmd

        async for reply in fn(checked(), context):
            yield reply

    return telemetry


def handlers(service: MessagingService, access: GrpcAccess | None = None) -> grpc.GenericRpcHandler:
    """Every MessagingService method of the protocol, with the servicer's method and a lenient decoder (the
    generated ``add_..._to_server`` would let a decode error out as an UNKNOWN gRPC error); ``access``: the ACL
    check every call passes first (``aclEnable``)."""
    desc = svc.DESCRIPTOR.services_by_name["MessagingService"]
    table = {}
    for m in desc.methods:
        request, response = getattr(svc, m.input_type.name), getattr(svc, m.output_type.name)
        fn = getattr(service, m.name)
        kwargs = {"request_deserializer": _lenient(request), "response_serializer": response.SerializeToString}
        if m.client_streaming:  # Telemetry: each command decoded alone, a malformed one answered in the stream
            table[m.name] = grpc.stream_stream_rpc_method_handler(
                fn if access is None else _checked_telemetry(fn, access), **kwargs)
        elif m.server_streaming:
            table[m.name] = grpc.unary_stream_rpc_method_handler(_refusing(fn, response, True, access), **kwargs)
        else:
            table[m.name] = grpc.unary_unary_rpc_method_handler(_refusing(fn, response, False, access), **kwargs)
    return grpc.method_handlers_generic_handler(desc.full_name, table)
