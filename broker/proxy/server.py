"""``GrpcProxy``: the grpc.aio server of the v2 endpoint, on the broker's event loop (enableProxy, grpcServerPort).

Started after the broker (it serves from the open store) and stopped before it: in-flight RPCs get a grace
period, parked receives answer at once, and the pop state is already in the CommitLog.  A gRPC message larger than
maxMessageSize plus room for the envelope is refused by gRPC itself (RESOURCE_EXHAUSTED) before it is decoded;
a body over maxMessageSize within that room gets MESSAGE_BODY_TOO_LARGE.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

from broker.proxy.pop import PopService
from broker.proxy.service import Malformed, MessagingService
from broker.proxy.status import Code, status
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
    """enableProxy on a broker that cannot serve it: a slave (pop state and sends are written to the CommitLog), or
    one with ACL on (the gRPC endpoint does not check it yet)."""


class GrpcProxy:
    def __init__(self, broker: BrokerController, host: str | None = None) -> None:
        self.broker = broker
        self.host = host or broker.host
        self.pop = PopService(broker)
        self.service = MessagingService(broker, self.pop)
        limit = broker.store_config.max_message_size + ENVELOPE_ROOM
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                               ("grpc.so_reuseport", 0)])  # fmt: skip
        self.server.add_generic_rpc_handlers((handlers(self.service),))
        self.port = 0

    async def start(self) -> None:
        if self.broker.is_slave:
            raise ProxyRoleError("enableProxy=true on a SLAVE: the gRPC endpoint writes sends and pop checkpoints "
                                 "to the CommitLog, which only the master does; enable it on the master")  # fmt: skip
        if self.broker.config.acl_enable:  # never serve open by accident
            raise ProxyRoleError("enableProxy=true with aclEnable=true: the gRPC endpoint does not check ACL "
                                 "signatures yet, so it would serve every client unchecked; turn one of them off")
        credentials = server_credentials(self.broker.config.tls)
        await self.pop.start()
        port = self.broker.config.grpc_server_port
        try:
            if credentials is None:
                self.port = self.server.add_insecure_port(f"{self.host}:{port}")
            else:
                self.port = self.server.add_secure_port(f"{self.host}:{port}", credentials)
        except RuntimeError as e:  # grpcio's "Failed to bind": the port is taken
            self.port = 0
            log.error("gRPC proxy: %s", e)
        if self.port == 0:
            await self.pop.stop()
            raise ProxyPortError(f"gRPC proxy: cannot listen on {self.host}:{port} (grpcServerPort): in use?")
        if port == 0:
            self.broker.config.grpc_server_port = self.port
        await self.server.start()
        log.debug("gRPC proxy (apache.rocketmq.v2.MessagingService) serving on %s:%d", self.host, self.port)

    async def stop(self, grace: float = 2.0) -> None:
        await self.pop.stop()
        await self.server.stop(grace)
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


def _refusing(fn: Callable[..., Any], response: Any, streaming: bool) -> Callable[..., Any]:
    """``fn``, except that a Malformed request is answered with ``response(status=BAD_REQUEST)`` and an unexpected
    exception with INTERNAL_SERVER_ERROR (never an UNKNOWN gRPC error without a v2 status)."""
    if streaming:

        @functools.wraps(fn)
        async def stream(request: Any, context: Any) -> Any:
            if isinstance(request, Malformed):
                yield response(status=status(Code.BAD_REQUEST, request.reason))
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
        if isinstance(request, Malformed):
            return response(status=status(Code.BAD_REQUEST, request.reason))
        try:
            return await fn(request, context)
        except Exception:
            return _failed(fn.__name__, response)

    return unary


def handlers(service: MessagingService) -> grpc.GenericRpcHandler:
    """Every MessagingService method of the protocol, with the servicer's method and a lenient decoder (the
    generated ``add_..._to_server`` would let a decode error out as an UNKNOWN gRPC error)."""
    desc = svc.DESCRIPTOR.services_by_name["MessagingService"]
    table = {}
    for m in desc.methods:
        request, response = getattr(svc, m.input_type.name), getattr(svc, m.output_type.name)
        fn = getattr(service, m.name)
        kwargs = {"request_deserializer": _lenient(request), "response_serializer": response.SerializeToString}
        if m.client_streaming:  # Telemetry: each command decoded alone, a malformed one answered in the stream
            table[m.name] = grpc.stream_stream_rpc_method_handler(fn, **kwargs)
        elif m.server_streaming:
            table[m.name] = grpc.unary_stream_rpc_method_handler(_refusing(fn, response, True), **kwargs)
        else:
            table[m.name] = grpc.unary_unary_rpc_method_handler(_refusing(fn, response, False), **kwargs)
    return grpc.method_handlers_generic_handler(desc.full_name, table)
