"""The plain ACL on a real broker (in-process, on loopback): signed and refused requests over the wire, the
file watched and reloaded, the admin codes 50-54 writing plain_acl.yml, start-up refusing a missing or bad file,
and the stock C++ client's ``set_session_credentials`` path against ``mqlake up``."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from rocketmq.client import Message, Producer, PushConsumer
from rocketmq.exceptions import ProducerSendSyncFailed

from broker.acl.rules import AclConfigError
from broker.client import Admin
from broker.config import build_configs
from broker.remoting import headers as h
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.loop import run
from broker.remoting.signing import Credentials
from broker.server.controller import BrokerController
from store.format import hashing, properties
from tests.aio import async_test, poll
from tests.helpers import wait_until
from tests.live_broker import SMALL, running_broker

pytestmark = pytest.mark.integration

ADMIN = Credentials("admin-key", "admin-secret")
PRODUCER = Credentials("producer-key", "producer-secret")
ACL = {
    "globalWhiteRemoteAddresses": [],
    "accounts": [
        {"accessKey": "admin-key", "secretKey": "admin-secret", "admin": True},
        {"accessKey": "producer-key", "secretKey": "producer-secret", "admin": False, "defaultTopicPerm": "PUB",
         "defaultGroupPerm": "SUB", "topicPerms": ["Denied=DENY", "ReadOnly=SUB"], "groupPerms": ["NoGroup=DENY"]},
    ],
}  # fmt: skip
# What a broker signs its registrations with (broker.conf's innerClientAuthenticationCredentials): with aclEnable
# a NameServer takes them only from an admin account.
BROKER_SIGNS = '{"accessKey":"admin-key","secretKey":"admin-secret"}'


def write_acl(home: Path, data: dict | str) -> Path:
    path = home / "conf" / "plain_acl.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def acl_broker(tmp_path: Path, acl: dict | str = ACL, **conf: str) -> AsyncIterator[BrokerController]:
    write_acl(tmp_path / "home", acl)
    async with running_broker(tmp_path / "store", aclEnable="true", rocketmqHome=str(tmp_path / "home"),
                              **conf) as controller:  # fmt: skip
        yield controller


def send_cmd(topic: str, body: bytes = b"hello", code: int = RequestCode.SEND_MESSAGE_V2) -> RemotingCommand:
    v1 = h.SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4, queue_id=0, sys_flag=0,
        born_timestamp=int(time.time() * 1000), flag=0, properties=properties.encode_properties({"K": "v"}).decode(),
    )  # fmt: skip
    header = h.SendMessageRequestHeaderV2.from_v1(v1) if code == RequestCode.SEND_MESSAGE_V2 else v1
    return RemotingCommand.request(code, header, body)


async def call(addr: str, cmd: RemotingCommand, creds: Credentials | None = None) -> RemotingCommand:
    client = RemotingClient(rpc_hook=creds.sign if creds is not None else None)
    try:
        return await client.invoke(addr, cmd, 10)
    finally:
        await client.close()


@async_test
async def test_signed_requests_pass_and_every_refusal_answers_no_permission(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as broker:
        ok = await call(broker.addr, send_cmd("Orders"), PRODUCER)
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        await poll(lambda: broker.store.get_max_offset_in_queue("Orders", 0) == 1, what="the send to be dispatched")

        refusals = {
            "unsigned": (await call(broker.addr, send_cmd("Orders")), "No accessKey is configured"),
            "unknown key": (await call(broker.addr, send_cmd("Orders"), Credentials("stranger-key", "whatever1")),
                            "No acl config for stranger-key"),
            "wrong secret": (await call(broker.addr, send_cmd("Orders"), Credentials("producer-key", "guessed-secret")),
                             "Check signature failed for accessKey=producer-key"),
            "denied topic": (await call(broker.addr, send_cmd("Denied"), PRODUCER),
                             "No default permission for topic:Denied"),
            "read-only topic": (await call(broker.addr, send_cmd("ReadOnly", code=RequestCode.SEND_MESSAGE), PRODUCER),
                                "No default permission for topic:ReadOnly"),
            "admin code": (await call(broker.addr, RemotingCommand.request(
                RequestCode.UPDATE_AND_CREATE_TOPIC, h.CreateTopicRequestHeader(
                    topic="New", default_topic="TBW102", read_queue_nums=1, write_queue_nums=1, perm=6,
                    topic_filter_type="SINGLE_TAG")), PRODUCER),
                "Need admin permission for request code=17, but accessKey=producer-key is not"),
            "denied group": (await call(broker.addr, RemotingCommand.request(
                RequestCode.QUERY_CONSUMER_OFFSET,
                h.QueryConsumerOffsetRequestHeader(consumer_group="NoGroup", topic="Orders", queue_id=0)), PRODUCER),
                "No default permission for group:NoGroup"),
        }  # fmt: skip
        for what, (resp, remark) in refusals.items():
            assert (resp.code, resp.remark) == (ResponseCode.NO_PERMISSION, remark), what
            assert "producer-secret" not in (resp.remark or "") and "admin-secret" not in (resp.remark or "")
        assert (await call(broker.addr, send_cmd("Orders"), PRODUCER)).code == ResponseCode.SUCCESS
        # records dispatch in order: once this last one is readable, a refused send would have been too
        await poll(lambda: broker.store.get_max_offset_in_queue("Orders", 0) == 2, what="the send to be dispatched")
        assert broker.store.get_max_offset_in_queue("Denied", 0) == 0
        admin = await call(broker.addr, RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_TOPIC, h.CreateTopicRequestHeader(
                topic="New", default_topic="TBW102", read_queue_nums=1, write_queue_nums=1, perm=6,
                topic_filter_type="SINGLE_TAG")), ADMIN)  # fmt: skip
        assert admin.code == ResponseCode.SUCCESS, admin.remark
        info = await call(broker.addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), ADMIN)
        assert info.code == ResponseCode.SUCCESS and info.body
        assert b"admin-secret" not in info.body and b"producer-secret" not in info.body


@async_test
async def test_tampered_bodies_and_oversized_keys_are_refused_and_the_broker_keeps_serving(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as broker:
        client = RemotingClient()
        try:
            signed = send_cmd("Orders", b"the whole body")
            PRODUCER.sign(signed)
            truncated = RemotingCommand.request(signed.code, ext=dict(signed.ext_fields), body=b"the whole")
            replayed = RemotingCommand.request(signed.code, ext=dict(signed.ext_fields), body=b"a different body")
            huge = send_cmd("Orders")
            huge.ext_fields.update(AccessKey="K" * 1_000_000, Signature="x")
            for cmd in (truncated, replayed, huge):
                resp = await client.invoke(broker.addr, cmd, 10)
                assert resp.code == ResponseCode.NO_PERMISSION
                assert len(resp.remark or "") < 200
            resp = await client.invoke(broker.addr, signed, 10)  # the untouched original still goes through
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            await poll(lambda: broker.store.get_max_offset_in_queue("Orders", 0) == 1, what="the send to dispatch")
            assert (await client.invoke(broker.addr, send_cmd("Orders"), 10)).code == ResponseCode.NO_PERMISSION
        finally:
            await client.close()


@pytest.mark.expected_errors("ACL file changed but cannot be used")
@async_test
async def test_file_changes_are_reloaded_and_a_bad_version_keeps_the_last_good_rules(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    newcomer = Credentials("newcomer-key", "newcomer-secret")
    async with acl_broker(tmp_path) as broker:
        assert (await call(broker.addr, send_cmd("Orders"), newcomer)).code == ResponseCode.NO_PERMISSION
        accounts = [*ACL["accounts"], {"accessKey": "newcomer-key", "secretKey": "newcomer-secret",
                                       "defaultTopicPerm": "PUB"}]  # fmt: skip
        write_acl(tmp_path / "home", {**ACL, "accounts": accounts})

        async def newcomer_allowed() -> bool:
            return (await call(broker.addr, send_cmd("Orders"), newcomer)).code == ResponseCode.SUCCESS

        await poll(newcomer_allowed, timeout=15, what="the new account to be loaded", interval=0.1)

        with caplog.at_level(logging.ERROR, logger="broker.acl.manager"):
            write_acl(tmp_path / "home", "accounts:\n- accessKey: newcomer-key\n  secretKey: [broken\n")
            await poll(lambda: "cannot be used" in caplog.text, timeout=15, what="the bad version to be logged")
        assert "plain_acl.yml:4" in caplog.text and "newcomer-secret" not in caplog.text
        assert await newcomer_allowed()  # the last good rules are still in force

        write_acl(tmp_path / "home", {**ACL, "globalWhiteRemoteAddresses": ["127.0.0.*"]})

        async def unsigned_allowed() -> bool:
            return (await call(broker.addr, send_cmd("Denied"))).code == ResponseCode.SUCCESS

        await poll(unsigned_allowed, timeout=15, what="the global white list to be loaded", interval=0.1)


@pytest.mark.parametrize(
    ("acl", "expected"),
    [(None, r"plain_acl\.yml: cannot read the ACL file"),
     ("accounts:\n  - accessKey: admin-key\n    secretKey: \"unclosed\n", r"plain_acl\.yml:\d+: not valid YAML"),
     ("accounts:\n- accessKey: admin-key\n  secretKey: admin-secret\n  defaultTopicPerm: READ\n",
      r"plain_acl\.yml:4: invalid ACL file: accounts\.0\.defaultTopicPerm")],
)  # fmt: skip
@async_test
async def test_start_up_stops_on_a_missing_or_bad_file(tmp_path: Path, acl: str | None, expected: str) -> None:
    home = tmp_path / "home"
    if acl is not None:
        write_acl(home, acl)
    values = {**SMALL, "listenPort": "0", "storePathRootDir": str(tmp_path / "store"), "aclEnable": "true",
              "rocketmqHome": str(home)}  # fmt: skip
    controller = BrokerController(*build_configs(values))
    with pytest.raises(AclConfigError, match=expected) as err:
        await controller.start()
    assert "admin-secret" not in str(err.value)
    assert controller.server.connections == frozenset() and controller._store is None


@async_test
async def test_acl_admin_codes_write_the_yaml(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as broker:
        create = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, h.CreateAccessConfigRequestHeader(
            access_key="consumer-key", secret_key="consumer-secret", default_topic_perm="SUB",
            topic_perms="Orders=SUB,Audit=DENY", group_perms="cg=SUB"))  # fmt: skip
        refused = await call(broker.addr, create, PRODUCER)
        assert (refused.code, refused.remark) == (
            ResponseCode.NO_PERMISSION,
            "Need admin permission for request code=50, but accessKey=producer-key is not",
        )
        create.ext_fields.pop("Signature")
        assert (await call(broker.addr, create, ADMIN)).code == ResponseCode.SUCCESS
        on_disk = yaml.safe_load(broker.config.acl_file.read_text())
        written = next(a for a in on_disk["accounts"] if a["accessKey"] == "consumer-key")
        assert written == {"accessKey": "consumer-key", "secretKey": "consumer-secret", "admin": False,
                           "defaultTopicPerm": "SUB", "topicPerms": ["Orders=SUB", "Audit=DENY"],
                           "groupPerms": ["cg=SUB"]}  # fmt: skip
        assert on_disk["dataVersion"][0]["counter"] == 1
        consumer = Credentials("consumer-key", "consumer-secret")
        pull = RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, h.QueryConsumerOffsetRequestHeader(
            consumer_group="cg", topic="Orders", queue_id=0))  # fmt: skip
        assert (await call(broker.addr, pull, consumer)).code != ResponseCode.NO_PERMISSION

        bad = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, h.CreateAccessConfigRequestHeader(
            access_key="short", secret_key="tiny"))  # fmt: skip
        resp = await call(broker.addr, bad, ADMIN)
        assert resp.code == ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED and "tiny" not in (resp.remark or "")

        white = RemotingCommand.request(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
                                        h.UpdateGlobalWhiteAddrsConfigRequestHeader(
                                            global_white_addrs="10.1.1.*,192.168.0.{1,2}"))  # fmt: skip
        assert (await call(broker.addr, white, ADMIN)).code == ResponseCode.SUCCESS
        bad_white = RemotingCommand.request(
            RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
            h.UpdateGlobalWhiteAddrsConfigRequestHeader(global_white_addrs="1.2.3"),
        )
        assert (await call(broker.addr, bad_white, ADMIN)).code == ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED

        info = await call(broker.addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_ACL_INFO), ADMIN)
        assert info.code == ResponseCode.SUCCESS and '"counter":2' in info.ext_fields["version"]
        conf = await call(broker.addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG), ADMIN)
        assert conf.code == ResponseCode.SUCCESS
        assert b"consumer-secret" not in conf.body and b"admin-secret" not in conf.body
        assert b"192.168.0.{1,2}" in conf.body

        delete = RemotingCommand.request(
            RequestCode.DELETE_ACL_CONFIG, h.DeleteAccessConfigRequestHeader(access_key="consumer-key")
        )
        assert (await call(broker.addr, delete, ADMIN)).code == ResponseCode.SUCCESS
        assert (await call(broker.addr, pull, consumer)).remark == "No acl config for consumer-key"
        on_disk = yaml.safe_load(broker.config.acl_file.read_text())
        assert [a["accessKey"] for a in on_disk["accounts"]] == ["admin-key", "producer-key"]
        assert on_disk["globalWhiteRemoteAddresses"] == ["10.1.1.*", "192.168.0.{1,2}"]


@async_test
async def test_a_query_answers_only_its_topic_even_when_another_topics_key_shares_the_hash(tmp_path: Path) -> None:
    """The IndexFile keeps a 32-bit hash of ``topic#key``, and "Aa" and "BB" hash alike in Java: "AaOpen#order-7"
    and "BBOpen#order-7" share a slot. With SUB on AaOpen only, a query there must not return BBOpen's record."""
    same = {hashing.index_key_hash(hashing.index_key(t, "order-7")) for t in ("AaOpen", "BBOpen")}
    assert len(same) == 1
    reader = Credentials("reader-key", "reader-secret")
    accounts = [*ACL["accounts"], {"accessKey": "reader-key", "secretKey": "reader-secret",
                                   "defaultTopicPerm": "DENY", "topicPerms": ["AaOpen=SUB"]}]  # fmt: skip
    async with acl_broker(tmp_path, {**ACL, "accounts": accounts}) as broker:
        keyed = send_cmd("BBOpen", b"not for the reader", code=RequestCode.SEND_MESSAGE)
        keyed.ext_fields["properties"] = properties.encode_properties({"KEYS": "order-7"}).decode()
        assert (await call(broker.addr, keyed, ADMIN)).code == ResponseCode.SUCCESS
        await poll(lambda: broker.store.get_max_offset_in_queue("BBOpen", 0) == 1, what="the send to dispatch")

        def query(topic: str) -> RemotingCommand:
            return RemotingCommand.request(RequestCode.QUERY_MESSAGE, h.QueryMessageRequestHeader(
                topic=topic, key="order-7", max_num=32, begin_timestamp=0, end_timestamp=2**62))  # fmt: skip

        admin_view = await call(broker.addr, query("BBOpen"), ADMIN)
        assert admin_view.code == ResponseCode.SUCCESS and b"not for the reader" in admin_view.body
        collided = await call(broker.addr, query("AaOpen"), reader)
        assert collided.code == ResponseCode.QUERY_NOT_FOUND and b"not for the reader" not in collided.body
        refused = await call(broker.addr, query("BBOpen"), reader)
        assert (refused.code, refused.remark) == (ResponseCode.NO_PERMISSION, "No default permission for topic:BBOpen")


# --- the C++ client ---------------------------------------------------------------------------------------------


def test_cpp_client_session_credentials_sign_sends_and_consumption(mqlake_server_factory, tmp_path: Path) -> None:
    home = tmp_path / "home"
    reader = {"accessKey": "consumer-key", "secretKey": "consumer-secret", "defaultTopicPerm": "SUB",
              "defaultGroupPerm": "SUB"}  # fmt: skip
    write_acl(home, {**ACL, "accounts": [*ACL["accounts"], reader]})
    # no innerClientAuthenticationCredentials: `mqlake up`'s broker registers with its own NameServer under an
    # account made at start, so the C++ client finds its routes on an ACL NameServer
    server = mqlake_server_factory(aclEnable="true", rocketmqHome=str(home))

    def producer(secret: str) -> Producer:
        p = Producer(f"acl_pg_{secret}")
        p.set_namesrv_addr(server.namesrv_addr)
        p.set_session_credentials("producer-key", secret, "ALIYUN")
        p.start()
        return p

    good = producer("producer-secret")
    try:
        msg = Message("CppSigned")
        msg.set_body("signed by the C++ client")
        assert good.send_sync(msg).status == 0
    finally:
        good.shutdown()

    async def routed() -> None:
        async with Admin(server.namesrv_addr) as admin:
            await poll(lambda: admin.topic_route("CppSigned"), timeout=30, what="CppSigned's route", interval=0.1)

    run(routed())
    received: list[bytes] = []
    lock = threading.Lock()

    def on_message(m) -> None:  # called on the client's threads
        with lock:
            received.append(m.body)

    def consumer(access_key: str, secret: str) -> PushConsumer:
        c = PushConsumer(f"acl_cpp_cg_{access_key}")  # heartbeats, pulls and offset commits, signed by the client
        c.set_namesrv_addr(server.namesrv_addr)
        c.set_session_credentials(access_key, secret, "ALIYUN")
        c.subscribe("CppSigned", on_message, "*")
        c.start()
        return c

    publisher_only = consumer("producer-key", "producer-secret")  # PUB on topics: its heartbeat is refused
    try:
        wait_until(lambda: "refused 34 from" in server.log_text() and "topic:CppSigned" in server.log_text(), 30,
                   what="the publisher's heartbeat to be refused")  # fmt: skip
    finally:
        publisher_only.shutdown()
    assert received == []
    reader = consumer("consumer-key", "consumer-secret")
    try:
        wait_until(lambda: b"signed by the C++ client" in received, 30, what="the C++ consumer to get the message")
    finally:
        reader.shutdown()
    bad = producer("not-the-secret")
    try:
        msg = Message("CppSigned")
        msg.set_body("forged")
        with pytest.raises(ProducerSendSyncFailed):
            bad.send_sync(msg)
    finally:
        bad.shutdown()
    log = server.log_text()
    assert "Check signature failed for accessKey=producer-key" in log  # refused by the ACL, not lost elsewhere
    assert "not-the-secret" not in log and "producer-secret" not in log and "consumer-secret" not in log


@pytest.mark.expected_errors("plain_acl.yml cannot be read")
def test_a_deleted_file_is_reported_once_and_the_rules_stay(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from broker.acl.manager import PlainAclManager

    path = write_acl(tmp_path, ACL)
    manager = PlainAclManager(path)
    assert not run(manager.reload_if_changed_async()), "the watcher's poll: unchanged bytes install nothing"
    path.unlink()
    with caplog.at_level(logging.ERROR, logger="broker.acl.manager"):
        assert not run(manager.reload_if_changed_async()) and not run(manager.reload_if_changed_async())
    assert caplog.text.count("cannot be read") == 1
    assert "producer-key" in manager.rules.accounts
    write_acl(tmp_path, {"accounts": [ACL["accounts"][0]]})
    assert run(manager.reload_if_changed_async()) and "producer-key" not in manager.rules.accounts
    assert not run(manager.reload_if_changed_async()) and not manager.reload_if_changed()
