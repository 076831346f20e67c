"""The gRPC endpoint a route (QueryRoute, QueryAssignment) names for this broker's queues.

Outside controller mode the broker answers as RocketMQ 5's proxy in local mode does for one broker: the queues are
reached where the client reached the proxy (the endpoints it asked with).  In controller mode the broker set's
master moves, so a route names the *current master's* endpoint, whichever broker of the set is asked: a master
names itself, a slave the master the controllers named.  A master's endpoint is its ``brokerIP1`` and
``grpcServerPort`` (RocketMQ's local mode maps a broker's address to its host and the proxy's gRPC port the same
way); a slave reads the two from the master's GET_BROKER_CONFIG, once per master epoch.  A 5.x client that lists
every broker of the set as its access point is thus sent to the new master at its next route refresh after a
failover (docs/ha.md, "RocketMQ 5 clients through a failover").
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from broker.config import parse_properties
from broker.proxy.v2 import definition_pb2 as pb
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError

if TYPE_CHECKING:
    from broker.server.controller import BrokerController

log = logging.getLogger(__name__)

CALL_TIMEOUT = 3.0  # s for the master's GET_BROKER_CONFIG


def endpoint(host: str, port: int) -> pb.Endpoints:
    return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=port)])


class MasterRoute:
    """Where this broker's queues are served: see the module's docstring."""

    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self._learned: tuple[tuple[str, int], pb.Endpoints | None] | None = None  # ((master addr, epoch), endpoint)
        self._lock = asyncio.Lock()
        self._client: RemotingClient | None = None

    def own(self) -> pb.Endpoints:
        c = self.broker.config
        return endpoint(c.broker_ip1, c.grpc_server_port)

    async def endpoints(self, asked: pb.Endpoints) -> pb.Endpoints:
        if self.broker.config.enable_controller_mode:
            if not self.broker.is_slave:
                return self.own()
            found = await self._master()
            if found is not None:
                return found
        # local mode; also a slave that cannot tell where its master serves: the client's own access point
        return asked if asked.addresses else self.own()

    async def _master(self) -> pb.Endpoints | None:
        replicas = self.broker.replicas
        if replicas is None or not replicas.master_addr:
            return None
        key = (replicas.master_addr, replicas.master_epoch)
        async with self._lock:  # one GET_BROKER_CONFIG for the routes asked meanwhile
            if self._learned is None or self._learned[0] != key:
                answered, found = await self._ask(key[0])
                if not answered:
                    return None  # asked again at the next route
                self._learned = (key, found)
            return self._learned[1]

    async def _ask(self, master: str) -> tuple[bool, pb.Endpoints | None]:
        """(whether the master answered, its endpoint: None when it serves no gRPC, ``enableProxy=false``)."""
        if self._client is None:
            creds = self.broker.registrar.credentials  # a master with aclEnable answers a known account only
            self._client = RemotingClient(language="JAVA", rpc_hook=creds.sign if creds is not None else None)
        try:
            resp = await self._client.invoke(master, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG),
                                             CALL_TIMEOUT)  # fmt: skip
        except RemotingError as e:
            log.warning("gRPC route: the master %s did not say where it serves gRPC: %s", master, e)
            return False, None
        if resp.code != ResponseCode.SUCCESS:
            log.warning("gRPC route: the master %s refused GET_BROKER_CONFIG: %d %s", master, resp.code, resp.remark)
            return False, None
        conf = parse_properties(resp.body.decode("utf-8", errors="replace"), f"config of {master}")
        if conf.get("enableProxy", "false").lower() != "true":
            log.warning("gRPC route: the master %s has enableProxy=false: routes name the client's access point",
                        master)  # fmt: skip
            return True, None
        try:
            port = int(conf.get("grpcServerPort", ""))
        except ValueError:
            log.warning("gRPC route: the master %s names no grpcServerPort", master)
            return False, None
        found = endpoint(conf.get("brokerIP1") or master.rpartition(":")[0], port)
        log.info("gRPC route: the master %s serves gRPC at %s:%d", master, found.addresses[0].host, port)
        return True, found

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
