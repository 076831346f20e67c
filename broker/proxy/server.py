"""``GrpcProxy``: the grpc.aio server of the v2 endpoint, on the broker's event loop (enableProxy, grpcServerPort).

Started after the broker (it serves from the open store) and stopped before it: in-flight RPCs get a grace
period, parked receives answer at once, and the pop state is already in the CommitLog.  A gRPC message larger than
maxMessageSize plus room for the envelope is refused by gRPC itself (RESOURCE_EXHAUSTED) before it is decoded;
a body over maxMessageSize within that room gets MESSAGE_BODY_TOO_LARGE.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import grpc

from broker.proxy.pop import PopService
from broker.proxy.service import MessagingService
from broker.proxy.v2 import service_pb2_grpc

if TYPE_CHECKING:
    from broker.server.controller import BrokerController

log = logging.getLogger(__name__)

ENVELOPE_ROOM = 64 * 1024  # properties, topic and the other fields around a body of maxMessageSize


class GrpcProxy:
    def __init__(self, broker: BrokerController, host: str | None = None) -> None:
        self.broker = broker
        self.host = host or broker.host
        self.pop = PopService(broker)
        self.service = MessagingService(broker, self.pop)
        limit = broker.store_config.max_message_size + ENVELOPE_ROOM
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                               ("grpc.so_reuseport", 0)])  # fmt: skip
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.service, self.server)
        self.port = 0

    async def start(self) -> None:
        await self.pop.start()
        port = self.broker.config.grpc_server_port
        self.port = self.server.add_insecure_port(f"{self.host}:{port}")
        if self.port == 0:
            await self.pop.stop()
            raise OSError(f"gRPC proxy: cannot listen on {self.host}:{port} (grpcServerPort)")
        if port == 0:
            self.broker.config.grpc_server_port = self.port
        await self.server.start()
        log.info("gRPC proxy (apache.rocketmq.v2.MessagingService) serving on %s:%d", self.host, self.port)

    async def stop(self, grace: float = 2.0) -> None:
        await self.pop.stop()
        await self.server.stop(grace)
        log.info("gRPC proxy stopped")
