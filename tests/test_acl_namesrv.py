"""mqlake's NameServer with ``aclEnable``: its write codes (registration, KV config, topic deletion, write
permission) need a signed admin account of plain_acl.yml while its reads stay open; a broker with
``innerClientAuthenticationCredentials`` signs its registration and unregistration, so routes work; one without
them is refused and says which key to set."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from broker.client import Message, Producer
from broker.namesrv import NamesrvController
from broker.remoting import headers as h
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.signing import Credentials
from tests.aio import async_test, poll
from tests.live_broker import running_broker
from tests.test_acl_broker import ACL, ADMIN, BROKER_SIGNS, PRODUCER, call, write_acl
from tests.test_namesrv import CLUSTER, java_crc32, plain_body, topic_json

pytestmark = pytest.mark.integration

SECRETS = ("admin-secret", "producer-secret", "guessed-secret")


@contextlib.asynccontextmanager
async def acl_namesrv(tmp_path: Path, acl: dict = ACL) -> AsyncIterator[NamesrvController]:
    ns = NamesrvController("127.0.0.1", 0, acl_file=write_acl(tmp_path / "home", acl))
    await ns.start()
    try:
        yield ns
    finally:
        await ns.stop()


@contextlib.asynccontextmanager
async def connected(ns: NamesrvController) -> AsyncIterator[Callable[..., Awaitable[RemotingCommand]]]:
    """``ask(cmd, creds=None)`` over one connection: a registration lasts only as long as its channel."""
    client = RemotingClient()

    async def ask(cmd: RemotingCommand, creds: Credentials | None = None) -> RemotingCommand:
        if creds is not None:
            creds.sign(cmd)
        return await client.invoke(ns.address, cmd, 10)

    try:
        yield ask
    finally:
        await client.close()


def register_cmd(name: str = "broker-x", topics: tuple[str, ...] = ("Orders",)) -> RemotingCommand:
    body = plain_body({t: topic_json(t) for t in topics})
    hdr = h.RegisterBrokerRequestHeader(broker_name=name, broker_addr="127.0.0.1:10999", cluster_name=CLUSTER,
                                        ha_server_addr="127.0.0.1:11000", broker_id=0,
                                        body_crc32=java_crc32(body))  # fmt: skip
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, hdr, body)


def route_cmd(topic: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, h.GetRouteInfoRequestHeader(topic=topic))


def put_kv_cmd(value: str) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.PUT_KV_CONFIG, h.PutKVConfigRequestHeader(namespace="ORDER_TOPIC_CONFIG", key="Orders", value=value)
    )


def get_kv_cmd() -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.GET_KV_CONFIG, h.GetKVConfigRequestHeader(namespace="ORDER_TOPIC_CONFIG", key="Orders")
    )


def delete_topic_cmd(topic: str) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.DELETE_TOPIC_IN_NAMESRV, h.DeleteTopicFromNamesrvRequestHeader(topic=topic)
    )


def wipe_cmd(broker_name: str) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.WIPE_WRITE_PERM_OF_BROKER, h.WipeWritePermOfBrokerRequestHeader(broker_name=broker_name)
    )


REFUSALS = {
    "unsigned": (None, "No accessKey is configured"),
    "wrong secret": (Credentials("admin-key", "guessed-secret"), "Check signature failed for accessKey=admin-key"),
    "not admin": (PRODUCER, "Need admin permission for request code={code}, but accessKey=producer-key is not"),
}


async def assert_refused(ask: Callable[..., Awaitable[RemotingCommand]], make: Callable[[], RemotingCommand]) -> None:
    for what, (creds, remark) in REFUSALS.items():
        cmd = make()
        resp = await ask(cmd, creds)
        assert (resp.code, resp.remark) == (ResponseCode.NO_PERMISSION, remark.format(code=cmd.code)), what
        assert not any(s in (resp.remark or "") for s in SECRETS)


@async_test
async def test_write_codes_need_a_signed_admin_account_and_reads_stay_open(tmp_path: Path) -> None:
    async with acl_namesrv(tmp_path) as ns, connected(ns) as ask:
        await assert_refused(ask, register_cmd)
        assert (await ask(route_cmd("Orders"))).code == ResponseCode.TOPIC_NOT_EXIST  # nothing registered
        assert ns.table.brokers == {}

        ok = await ask(register_cmd(), ADMIN)
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        unsigned_read = await ask(route_cmd("Orders"))  # clients read routes before they can sign anything
        assert unsigned_read.code == ResponseCode.SUCCESS and b"broker-x" in unsigned_read.body

        await assert_refused(ask, lambda: put_kv_cmd("forged"))
        assert (await ask(get_kv_cmd())).code == ResponseCode.QUERY_NOT_FOUND
        assert (await ask(put_kv_cmd("broker-x:4"), ADMIN)).code == ResponseCode.SUCCESS
        read = await ask(get_kv_cmd())
        assert (read.code, read.ext_fields.get("value")) == (ResponseCode.SUCCESS, "broker-x:4")

        await assert_refused(ask, lambda: wipe_cmd("broker-x"))
        await assert_refused(ask, lambda: delete_topic_cmd("Orders"))
        await assert_refused(ask, lambda: RemotingCommand.request(
            RequestCode.DELETE_KV_CONFIG, h.DeleteKVConfigRequestHeader(namespace="ORDER_TOPIC_CONFIG", key="Orders")))
        await assert_refused(ask, lambda: RemotingCommand.request(
            RequestCode.UNREGISTER_BROKER, h.UnRegisterBrokerRequestHeader(
                broker_name="broker-x", broker_addr="127.0.0.1:10999", cluster_name=CLUSTER, broker_id=0)))  # fmt: skip
        # every refusal left the route, its write permission and the KV config as they were
        still = await ask(route_cmd("Orders"))
        assert still.code == ResponseCode.SUCCESS and json.loads(still.body)["queueDatas"][0]["perm"] == 6
        assert ns.kv.get("ORDER_TOPIC_CONFIG", "Orders") == "broker-x:4"

        assert (await ask(wipe_cmd("broker-x"), ADMIN)).code == ResponseCode.SUCCESS
        assert json.loads((await ask(route_cmd("Orders"))).body)["queueDatas"][0]["perm"] == 4
        assert (await ask(delete_topic_cmd("Orders"), ADMIN)).code == ResponseCode.SUCCESS
        assert (await ask(route_cmd("Orders"))).code == ResponseCode.TOPIC_NOT_EXIST


@async_test
async def test_white_listed_addresses_and_file_changes_apply_to_the_namesrv(tmp_path: Path) -> None:
    async with acl_namesrv(tmp_path) as ns, connected(ns) as ask:
        assert (await ask(register_cmd())).code == ResponseCode.NO_PERMISSION
        write_acl(tmp_path / "home", {**ACL, "globalWhiteRemoteAddresses": ["127.0.0.1"]})

        async def unsigned_registers() -> bool:
            return (await ask(register_cmd())).code == ResponseCode.SUCCESS

        await poll(unsigned_registers, timeout=15, what="the white list to be loaded", interval=0.1)


@async_test
async def test_a_broker_signs_its_registration_and_routes_work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with acl_namesrv(tmp_path) as ns:
        with caplog.at_level(logging.INFO):
            async with running_broker(tmp_path / "signed", namesrvAddr=ns.address, brokerName="broker-signed",
                                      innerClientAuthenticationCredentials=BROKER_SIGNS) as broker:  # fmt: skip
                assert "broker-signed" in ns.table.brokers  # registered during start
                async with Producer("ns_acl_pg", ns.address) as producer:  # the route comes from the NameServer
                    sent = await producer.send(Message("RoutedThroughAcl", "hello"))
                assert sent.queue.broker_name == "broker-signed"
                await poll(lambda: broker.store.get_max_offset_in_queue("RoutedThroughAcl", sent.queue.queue_id) == 1,
                           what="the routed send to be stored")  # fmt: skip
            # the broker's own UNREGISTER_BROKER went through (not only its channel closing)
            assert "unregistered broker broker-signed" in caplog.text
        assert "refused" not in caplog.text and "admin-secret" not in caplog.text


@async_test
async def test_a_broker_without_credentials_is_refused_and_told_which_key_to_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with acl_namesrv(tmp_path) as ns:
        with caplog.at_level(logging.WARNING, logger="broker.server.registration"):
            async with running_broker(tmp_path / "unsigned", namesrvAddr=ns.address, brokerName="broker-open"):
                assert "broker-open" not in ns.table.brokers
                assert (await call(ns.address, route_cmd("TBW102"))).code == ResponseCode.TOPIC_NOT_EXIST
        assert "refused registration: code 16 No accessKey is configured" in caplog.text
        assert "innerClientAuthenticationCredentials" in caplog.text


@async_test
async def test_a_slave_signs_its_copies_of_an_acl_masters_tables(tmp_path: Path) -> None:
    """The same account signs a slave's requests to its master (config copies, runtime info), as RocketMQ 5's
    broker signs all it sends: a master with aclEnable refuses them unsigned."""
    async with acl_namesrv(tmp_path) as ns:
        common = {"namesrvAddr": ns.address, "brokerName": "broker-ha", "slaveSyncInterval": "200",
                  "innerClientAuthenticationCredentials": BROKER_SIGNS}  # fmt: skip
        async with (
            running_broker(tmp_path / "master", brokerRole="ASYNC_MASTER", aclEnable="true",
                           rocketmqHome=str(tmp_path / "home"), **common) as master,
            running_broker(tmp_path / "slave", brokerRole="SLAVE", brokerId="1", **common) as slave,
        ):  # fmt: skip
            create = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, h.CreateTopicRequestHeader(
                topic="SyncedUnderAcl", default_topic="TBW102", read_queue_nums=2, write_queue_nums=2, perm=6,
                topic_filter_type="SINGLE_TAG"))  # fmt: skip
            assert (await call(master.addr, create, ADMIN)).code == ResponseCode.SUCCESS
            await poll(lambda: slave.topics.get("SyncedUnderAcl") is not None, timeout=15,
                       what="the slave to copy the master's new topic")  # fmt: skip
