"""Registering the broker with every configured NameServer: REGISTER_BROKER (103) and UNREGISTER_BROKER (104).

Both are signed with ``innerClientAuthenticationCredentials`` when it is set (as RocketMQ 5's broker signs its
outgoing requests): a NameServer with ``aclEnable=true`` takes them only from an admin account."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from broker.config import BrokerConfig
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import HeaderError, RemotingError
from broker.remoting.headers import (
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnRegisterBrokerRequestHeader,
)
from broker.remoting.protocol.topic import PERM_READ, PERM_WRITE, RegisterBrokerBody, TopicConfigSerializeWrapper
from broker.remoting.signing import Credentials
from broker.server.topics import TableBody, TopicConfigManager
from broker.tls_settings import tls_client_context
from store.format import hashing

log = logging.getLogger(__name__)

REGISTER_TIMEOUT = 6.0


class NamesrvRegistrar:
    """Announces ``topics`` (the whole table, every time) as the broker ``config`` names."""

    def __init__(self, config: BrokerConfig, topics: TopicConfigManager, ha_port: Callable[[], int]) -> None:
        self.config = config
        self.topics = topics
        self.ha_port = ha_port  # haListenPort, known once the broker has bound it
        # Told each reply's haServerAddr and masterAddr (RegisterBrokerResult): how a slave finds its master.
        self.on_registered: Callable[[str | None, str | None], None] | None = None
        self._body = TableBody(topics, self._announced)
        creds = config.inner_client_authentication_credentials
        self.credentials = Credentials(creds.access_key, creds.secret_key) if creds is not None else None
        sign = self.credentials.sign if self.credentials is not None else None
        self.client = RemotingClient(language="JAVA", ssl_context=tls_client_context(config.tls), rpc_hook=sign)
        self._lock = asyncio.Lock()  # one registration round at a time, so versions arrive in order

    def _announced(self, wrapper: TopicConfigSerializeWrapper) -> RegisterBrokerBody:
        # A broker that may not be written (or read) announces its topics with that permission masked out
        # (registerBrokerAll), so clients stop routing sends to it: how an operator drains a broker.
        perm = self.config.broker_permission
        if not (perm & PERM_WRITE and perm & PERM_READ):
            table = {name: tc.model_copy(update={"perm": tc.perm & perm})
                     for name, tc in wrapper.topic_config_table.items()}  # fmt: skip
            wrapper = wrapper.model_copy(update={"topic_config_table": table})
        return RegisterBrokerBody(topic_config_serialize_wrapper=wrapper)

    def _identity(self) -> dict[str, Any]:
        c = self.config
        return {
            "broker_name": c.broker_name,
            "broker_addr": c.broker_addr,
            "cluster_name": c.broker_cluster_name,
            "broker_id": c.broker_id,
        }

    async def register_all(self) -> int:
        """Register with every NameServer at once; returns how many accepted. Failures are logged, not raised."""
        addrs = self.config.namesrv_addrs
        if not addrs:
            return 0
        async with self._lock:
            body = await self._body.encode()
            c = self.config
            header = RegisterBrokerRequestHeader(
                **self._identity(),
                ha_server_addr=f"{c.broker_ip1}:{self.ha_port()}",
                compressed=False,
                body_crc32=hashing.body_crc32(body),
            )
            results = await asyncio.gather(*(self._register(a, header, body) for a in addrs))
        return sum(results)

    async def _register(self, addr: str, header: RegisterBrokerRequestHeader, body: bytes) -> bool:
        cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, header, body)
        try:
            resp = await self.client.invoke(addr, cmd, REGISTER_TIMEOUT)
        except RemotingError as e:
            log.warning("register broker to name server %s failed: %s", addr, e)
            return False
        if resp.code != ResponseCode.SUCCESS:
            log.warning("name server %s refused registration: code %d %s%s", addr, resp.code, resp.remark,
                        self._hint(resp))  # fmt: skip
            return False
        if self.on_registered is not None:
            try:
                result = resp.read_header(RegisterBrokerResponseHeader)
            except HeaderError as e:
                log.warning("name server %s: unreadable registration reply: %s", addr, e)
            else:
                self.on_registered(result.ha_server_addr or None, result.master_addr or None)
        return True

    async def unregister_all(self) -> None:
        header = UnRegisterBrokerRequestHeader(**self._identity())
        for addr in self.config.namesrv_addrs:
            cmd = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, header)
            try:
                resp = await self.client.invoke(addr, cmd, 3.0)
            except RemotingError as e:
                log.warning("unregister broker from name server %s failed: %s", addr, e)
                continue
            if resp.code != ResponseCode.SUCCESS:
                log.warning("name server %s refused unregistration: code %d %s%s", addr, resp.code, resp.remark,
                            self._hint(resp))  # fmt: skip

    def _hint(self, resp: RemotingCommand) -> str:
        if resp.code == ResponseCode.NO_PERMISSION and self.credentials is None:
            return " (the NameServer checks ACL: set innerClientAuthenticationCredentials to an admin account)"
        return ""

    async def close(self) -> None:
        await self.client.close()
