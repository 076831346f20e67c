"""What every client role shares (``MQClientInstance`` + ``MQClientAPIImpl``, trimmed): one RemotingClient, the
NameServer list, the route cache with its 30 s refresh, broker addresses, and the per-queue offset calls that the
pull consumer, the push consumer and the admin all make.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable

from broker.client.errors import MQBrokerError, MQClientError
from broker.client.message import MessageQueue
from broker.client.route import TopicRouteData, parse_route
from broker.remoting import headers as h
from broker.remoting.client import RemotingClient, RemotingError
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel
from broker.remoting.protocol.body import GetConsumerListByGroupResponseBody
from broker.remoting.protocol.route import ClusterInfo
from broker.remoting.signing import Credentials

log = logging.getLogger(__name__)

ROUTE_REFRESH_SECONDS = 30.0  # pollNameServerInterval
DEFAULT_TIMEOUT = 3.0

RequestHandler = Callable[[RemotingCommand, Channel], Awaitable[RemotingCommand | None]]


def local_ip() -> str:
    """The address other hosts would see (RocketMQ's ``RemotingUtil.getLocalAddress``), loopback as a fallback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # UDP connect sends nothing; it only picks the outbound address
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def split_namesrv_addr(namesrv_addr: str) -> list[str]:
    addrs = [a.strip() for a in namesrv_addr.replace(",", ";").split(";") if a.strip()]
    if not addrs:
        raise MQClientError(f"no NameServer address in {namesrv_addr!r}")
    return addrs


def check(resp: RemotingCommand, what: str, addr: str = "", ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> None:
    """Raise MQBrokerError unless the response code is one of ``ok``."""
    if resp.code not in ok:
        raise MQBrokerError(resp.code, resp.remark, addr, what)


class ClientInstance:
    """One connection pool and one route cache for one client object (producer, consumer or admin)."""

    def __init__(
        self,
        namesrv_addr: str,
        *,
        instance_name: str | None = None,
        request_handler: RequestHandler | None = None,
        connections_per_addr: int = 1,
        timeout: float = DEFAULT_TIMEOUT,
        credentials: Credentials | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``credentials`` sign every request (RocketMQ's ``AclClientRPCHook``); ``ssl_context`` makes every
        channel, to the NameServers and the brokers, TLS."""
        self.namesrv_addrs = split_namesrv_addr(namesrv_addr)
        self.timeout = timeout
        instance = instance_name or f"{os.getpid()}#{time.monotonic_ns()}"
        self.client_id = f"{local_ip()}@{instance}"
        self.remoting = RemotingClient(
            request_handler=request_handler,
            connections_per_addr=connections_per_addr,
            rpc_hook=credentials.sign if credentials is not None else None,
            ssl_context=ssl_context,
        )
        self.routes: dict[str, TopicRouteData] = {}
        self.broker_addrs: dict[str, str] = {}  # brokerName -> master address
        self._namesrv_index = 0
        self._refresh_task: asyncio.Task | None = None
        self._route_listeners: list[Callable[[str, TopicRouteData], None]] = []

    # -- life cycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._refresh_task is None:
            self._refresh_task = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def close(self) -> None:
        if self._refresh_task is not None:
            self._refresh_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh_task
            self._refresh_task = None
        await self.remoting.close()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(ROUTE_REFRESH_SECONDS)
            for topic in list(self.routes):
                try:
                    await self.update_route(topic)
                except Exception as e:  # a NameServer hiccup must not kill the refresh loop
                    log.warning("route refresh of %s failed: %s", topic, e)

    def add_route_listener(self, cb: Callable[[str, TopicRouteData], None]) -> None:
        self._route_listeners.append(cb)

    # -- NameServer -----------------------------------------------------------------------------------------
    async def invoke_namesrv(self, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        """Send to one NameServer; on a network failure try the next one (``invokeSync`` with a null addr)."""
        last: Exception | None = None
        n = len(self.namesrv_addrs)
        for i in range(n):
            addr = self.namesrv_addrs[(self._namesrv_index + i) % n]
            try:
                resp = await self.remoting.invoke(addr, cmd, timeout or self.timeout)
            except RemotingError as e:
                last = e
                continue
            self._namesrv_index = (self._namesrv_index + i) % n
            return resp
        raise MQClientError(f"no NameServer of {';'.join(self.namesrv_addrs)} answered: {last}") from last

    async def fetch_route(self, topic: str) -> TopicRouteData | None:
        """GET_ROUTEINFO_BY_TOPIC; None when the NameServer does not know the topic."""
        cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, h.GetRouteInfoRequestHeader(topic=topic))
        resp = await self.invoke_namesrv(cmd)
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        check(resp, f"route of {topic}")
        return parse_route(resp.body, f"route of {topic}")

    async def update_route(self, topic: str) -> TopicRouteData | None:
        route = await self.fetch_route(topic)
        if route is None:
            return None
        self.routes[topic] = route
        for b in route.broker_datas:
            if b.master_addr:
                self.broker_addrs[b.broker_name] = b.master_addr
        for cb in self._route_listeners:
            cb(topic, route)
        return route

    async def route(self, topic: str) -> TopicRouteData | None:
        """The cached route, fetched on first use."""
        route = self.routes.get(topic)
        if route is None:
            route = await self.update_route(topic)
        return route

    async def cluster_info(self) -> ClusterInfo:
        """GET_BROKER_CLUSTER_INFO: every broker's addresses and every cluster's broker names."""
        resp = await self.invoke_namesrv(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        check(resp, "cluster info")
        return ClusterInfo.decode(resp.body, "cluster info")

    # -- brokers ----------------------------------------------------------------------------------------------
    async def find_broker_addr(self, broker_name: str, topic: str | None = None) -> str:
        addr = self.broker_addrs.get(broker_name)
        if addr is None and topic is not None:
            await self.update_route(topic)
            addr = self.broker_addrs.get(broker_name)
        if addr is None:
            raise MQClientError(f"no master address known for broker {broker_name!r}")
        return addr

    async def invoke_broker(
        self, mq_or_name: MessageQueue | str, cmd: RemotingCommand, timeout: float | None = None
    ) -> tuple[str, RemotingCommand]:
        """Invoke on a broker's master given a queue or a broker name; returns (address, response)."""
        if isinstance(mq_or_name, MessageQueue):
            addr = await self.find_broker_addr(mq_or_name.broker_name, mq_or_name.topic)
        else:
            addr = await self.find_broker_addr(mq_or_name)
        return addr, await self.remoting.invoke(addr, cmd, timeout or self.timeout)

    async def _offset_call(self, code: int, header: h.Header, mq: MessageQueue, what: str) -> RemotingCommand:
        addr, resp = await self.invoke_broker(mq, RemotingCommand.request(code, header))
        check(resp, f"{what} of {mq.topic}:{mq.broker_name}:{mq.queue_id}", addr)
        return resp

    async def max_offset(self, mq: MessageQueue) -> int:
        """GET_MAX_OFFSET: the next offset to be written in the queue."""
        header = h.GetMaxOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id)
        resp = await self._offset_call(RequestCode.GET_MAX_OFFSET, header, mq, "max offset")
        return resp.read_header(h.GetMaxOffsetResponseHeader).offset

    async def min_offset(self, mq: MessageQueue) -> int:
        header = h.GetMinOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id)
        resp = await self._offset_call(RequestCode.GET_MIN_OFFSET, header, mq, "min offset")
        return resp.read_header(h.GetMinOffsetResponseHeader).offset

    async def earliest_msg_store_time(self, mq: MessageQueue) -> int:
        header = h.GetEarliestMsgStoretimeRequestHeader(topic=mq.topic, queue_id=mq.queue_id)
        resp = await self._offset_call(RequestCode.GET_EARLIEST_MSG_STORETIME, header, mq, "earliest store time")
        return resp.read_header(h.GetEarliestMsgStoretimeResponseHeader).timestamp

    async def search_offset(self, mq: MessageQueue, timestamp: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the queue offset of the message stored closest to ``timestamp`` (ms)."""
        header = h.SearchOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id, timestamp=timestamp)
        resp = await self._offset_call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, header, mq, "search offset")
        return resp.read_header(h.SearchOffsetResponseHeader).offset

    async def query_consumer_offset(self, group: str, mq: MessageQueue) -> int | None:
        """QUERY_CONSUMER_OFFSET; None when the broker has no offset for the group (QUERY_NOT_FOUND)."""
        header = h.QueryConsumerOffsetRequestHeader(consumer_group=group, topic=mq.topic, queue_id=mq.queue_id)
        addr, resp = await self.invoke_broker(mq, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, header))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        check(resp, f"consumer offset of {group} on {mq.topic}:{mq.queue_id}", addr)
        return resp.read_header(h.QueryConsumerOffsetResponseHeader).offset

    async def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int, *, oneway: bool) -> None:
        """UPDATE_CONSUMER_OFFSET; oneway for periodic commits (as the Java client), acknowledged otherwise."""
        header = h.UpdateConsumerOffsetRequestHeader(
            consumer_group=group, topic=mq.topic, queue_id=mq.queue_id, commit_offset=offset
        )
        cmd = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, header, oneway=oneway)
        addr = await self.find_broker_addr(mq.broker_name, mq.topic)
        if oneway:
            await self.remoting.invoke_oneway(addr, cmd)
        else:
            check(await self.remoting.invoke(addr, cmd, self.timeout), f"commit offset of {group}", addr)

    async def consumer_ids(self, group: str, broker_name: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP on one broker; [] when the broker knows no consumer of the group."""
        header = h.GetConsumerListByGroupRequestHeader(consumer_group=group)
        addr, resp = await self.invoke_broker(
            broker_name, RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, header)
        )
        if resp.code != ResponseCode.SUCCESS:
            return []
        if not resp.body:
            return []
        return GetConsumerListByGroupResponseBody.decode(resp.body, f"consumer list from {addr}").consumer_id_list
