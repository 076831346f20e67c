"""``mqlake admin`` ACL commands and mqlake's own client signing, against ``mqlake up`` with ``aclEnable=true``."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from broker.client import Admin, ConsumeResult, Message, MessageExt, Producer, PullConsumer, PushConsumer
from broker.client.errors import MQBrokerError
from broker.client.message import ConsumeFromWhere
from broker.remoting.codes import ResponseCode
from broker.remoting.loop import run
from broker.remoting.signing import Credentials
from cli.main import app
from tests.aio import poll
from tests.fixtures_broker import MqlakeServer, stop_servers
from tests.test_acl_broker import BROKER_SIGNS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

runner = CliRunner()
ADMIN_ENV = {"MQLAKE_ACCESS_KEY": "admin-key", "MQLAKE_SECRET_KEY": "admin-secret"}
ACL = {
    "accounts": [
        {"accessKey": "admin-key", "secretKey": "admin-secret", "admin": True},
        {"accessKey": "app-key-1", "secretKey": "app-secret-1", "defaultTopicPerm": "PUB|SUB",
         "defaultGroupPerm": "SUB", "topicPerms": ["Secret=DENY"]},
        {"accessKey": "writer-key", "secretKey": "writer-secret", "defaultTopicPerm": "PUB",
         "defaultGroupPerm": "SUB"},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One ``mqlake up`` with ACL on for the module; its plain_acl.yml is ``server.acl_file``."""
    home = tmp_path_factory.mktemp("rocketmq_home")
    (home / "conf").mkdir()
    (home / "conf" / "plain_acl.yml").write_text(yaml.safe_dump(ACL))
    s = MqlakeServer(tmp_path_factory.mktemp("mqlake-acl"), aclEnable="true", rocketmqHome=str(home),
                     innerClientAuthenticationCredentials=BROKER_SIGNS)  # fmt: skip
    s.acl_file = home / "conf" / "plain_acl.yml"
    yield s.start()
    stop_servers([s])


def admin(server, *args: str, env: dict[str, str] | None = None):
    argv = ["admin", *args, "-n", server.namesrv_addr, "-b", server.broker_addr, "--json"]
    return runner.invoke(app, argv, env={"MQLAKE_ACCESS_KEY": None, "MQLAKE_SECRET_KEY": None, **(env or {})})


def test_admin_commands_sign_and_write_plain_acl_yml(server) -> None:
    created = admin(server, "updateAclConfig", "-a", "cli-made-key", "-s", "cli-made-secret", "-i", "SUB",
                    "-t", "Orders=PUB|SUB,Audit=DENY", "-g", "cg1=SUB", env=ADMIN_ENV)  # fmt: skip
    assert created.exit_code == 0, created.output
    assert json.loads(created.stdout) == {"accessKey": "cli-made-key", "brokers": [server.broker_addr]}
    account = next(a for a in yaml.safe_load(server.acl_file.read_text())["accounts"]
                   if a["accessKey"] == "cli-made-key")  # fmt: skip
    assert account["secretKey"] == "cli-made-secret" and account["topicPerms"] == ["Orders=PUB|SUB", "Audit=DENY"]

    white = admin(server, "updateGlobalWhiteAddr", "-g", "10.9.8.*,192.168.7.{1,2}", env=ADMIN_ENV)
    assert white.exit_code == 0, white.output

    got = admin(server, "getAclConfig", env=ADMIN_ENV)
    assert got.exit_code == 0, got.output
    [conf] = json.loads(got.stdout)
    assert conf["globalWhiteAddrs"] == ["10.9.8.*", "192.168.7.{1,2}"]
    assert {a["accessKey"] for a in conf["plainAccessConfigs"]} >= {"admin-key", "app-key-1", "cli-made-key"}
    assert "cli-made-secret" not in got.stdout and "admin-secret" not in got.stdout

    deleted = admin(server, "deleteAclConfig", "-a", "cli-made-key", env=ADMIN_ENV)
    assert deleted.exit_code == 0, deleted.output
    assert "cli-made-key" not in server.acl_file.read_text()


@pytest.mark.parametrize(
    ("env", "remark"),
    [
        ({}, "No accessKey is configured"),
        ({"MQLAKE_ACCESS_KEY": "admin-key", "MQLAKE_SECRET_KEY": "wrong-secret"}, "Check signature failed"),
        ({"MQLAKE_ACCESS_KEY": "app-key-1", "MQLAKE_SECRET_KEY": "app-secret-1"}, "Need admin permission"),
    ],
)
def test_admin_commands_without_an_admin_signature_are_refused(server, env: dict[str, str], remark: str) -> None:
    result = admin(server, "updateAclConfig", "-a", "never-made-key", "-s", "never-made-secret", env=env)
    assert result.exit_code == 1
    assert remark in result.output and "wrong-secret" not in result.output
    assert "never-made-key" not in server.acl_file.read_text()


def test_half_given_credentials_are_a_usage_error(server) -> None:
    result = admin(server, "getAclConfig", env={"MQLAKE_ACCESS_KEY": "admin-key"})
    assert result.exit_code == 2 and "--secret-key" in result.output


def test_python_client_signs_sends_and_pulls(server) -> None:
    app_creds = Credentials("app-key-1", "app-secret-1")

    async def go() -> None:
        async with Producer("acl_pg", server.namesrv_addr, credentials=app_creds) as p:
            result = await p.send(Message("AclOrders", "signed"))
            with pytest.raises(MQBrokerError) as refused:
                await p.send(Message("Secret", "denied"))
        assert refused.value.code == ResponseCode.NO_PERMISSION
        assert "No default permission for topic:Secret" in str(refused.value)
        async with PullConsumer("acl_cg", server.namesrv_addr, credentials=app_creds) as c:

            async def pulled() -> list[bytes]:
                return [m.body for m in (await c.pull(result.queue, result.queue_offset, 1)).messages]

            assert await poll(pulled, timeout=10, what="the signed message to be pulled", interval=0.05) == [b"signed"]
        async with Producer("acl_pg2", server.namesrv_addr) as unsigned:
            with pytest.raises(MQBrokerError) as err:
                await unsigned.send(Message("AclOrders", "unsigned"))
            assert err.value.code == ResponseCode.NO_PERMISSION

    run(go())


def test_python_push_consumer_heartbeats_pulls_and_commits_signed(server) -> None:
    creds = Credentials("app-key-1", "app-secret-1")
    got: list[bytes] = []
    log_before = len(server.log_text())

    async def go() -> None:
        async with Producer("acl_push_pg", server.namesrv_addr, credentials=creds) as p:
            await p.send(Message("AclPushed", "first"))  # auto-creates the topic
        async with Admin(server.namesrv_addr) as admin:  # the NameServer knows it once the broker re-registered
            await poll(lambda: admin.topic_route("AclPushed"), timeout=30, what="the route", interval=0.1)
        consumer = PushConsumer("acl_push_cg", server.namesrv_addr, credentials=creds,
                                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)  # fmt: skip

        def handle(m: MessageExt) -> ConsumeResult:
            got.append(m.body)
            return ConsumeResult.SUCCESS

        consumer.subscribe("AclPushed", "*", handle)
        await consumer.start()
        try:
            await poll(lambda: b"first" in got, timeout=30, what="the pushed message", interval=0.05)
        finally:
            await consumer.shutdown()

    run(go())
    assert "refused" not in server.log_text()[log_before:]  # heartbeats, pulls, offset commits: all passed


def test_operator_commands_sign_too(server) -> None:
    """The mqadmin-style operator commands go through the same signing client as the ACL ones."""
    refused = admin(server, "updateBrokerConfig", "-k", "maxMessageSize", "-v", "4194304")
    assert refused.exit_code == 1 and "No accessKey is configured" in refused.output
    changed = admin(server, "updateBrokerConfig", "-k", "maxMessageSize", "-v", "4194304", env=ADMIN_ENV)
    assert changed.exit_code == 0, changed.output
    shown = admin(server, "getBrokerConfig", env=ADMIN_ENV)
    assert shown.exit_code == 0, shown.output
    assert "4194304" in shown.stdout


def test_query_by_key_and_view_by_id_need_sub_on_the_topic(server) -> None:
    writer, reader = Credentials("writer-key", "writer-secret"), Credentials("app-key-1", "app-secret-1")

    async def go() -> None:
        async with Producer("acl_query_pg", server.namesrv_addr, credentials=writer) as p:
            sent = await p.send(Message("AclQueried", "only for readers", keys="order-42"))
        async with Admin(server.namesrv_addr, credentials=reader) as allowed:
            await poll(lambda: allowed.topic_route("AclQueried"), timeout=30, what="the route", interval=0.1)
            found = await poll(lambda: allowed.query_msg_by_key("AclQueried", "order-42"), timeout=10,
                               what="the key to be indexed", interval=0.05)  # fmt: skip
            assert [m.body for m in found] == [b"only for readers"]
            assert (await allowed.view_message(sent.offset_msg_id)).body == b"only for readers"
        async with Admin(server.namesrv_addr, credentials=writer) as refused:  # PUB on the topic, no SUB
            with pytest.raises(MQBrokerError) as by_key:
                await refused.query_msg_by_key("AclQueried", "order-42")
            with pytest.raises(MQBrokerError) as by_id:
                await refused.view_message(sent.offset_msg_id)
        for err in (by_key.value, by_id.value):
            assert err.code == ResponseCode.NO_PERMISSION
            assert "No default permission for topic:AclQueried" in str(err)
            assert "only for readers" not in str(err) and "writer-secret" not in str(err)

    run(go())


def test_namesrv_write_commands_need_an_admin_signature(server) -> None:
    """`mqlake up` with aclEnable: its NameServer takes write codes only from admin accounts (its broker signs
    its registrations with innerClientAuthenticationCredentials, so every other test here finds its routes)."""

    def on_namesrv(*args: str, env: dict[str, str]):
        argv = ["admin", *args, "-b", "broker-a", "-n", server.namesrv_addr, "--json"]
        return runner.invoke(app, argv, env={"MQLAKE_ACCESS_KEY": None, "MQLAKE_SECRET_KEY": None, **env})

    for env, remark in [({}, "No accessKey is configured"),
                        ({"MQLAKE_ACCESS_KEY": "app-key-1", "MQLAKE_SECRET_KEY": "app-secret-1"},
                         "Need admin permission for request code=205, but accessKey=app-key-1 is not")]:  # fmt: skip
        refused = on_namesrv("wipeWritePerm", env=env)
        assert refused.exit_code == 1 and remark in refused.output
    wiped = on_namesrv("wipeWritePerm", env=ADMIN_ENV)
    assert wiped.exit_code == 0, wiped.output
    assert json.loads(wiped.stdout)[server.namesrv_addr] > 0  # the broker's topics lost their write permission
    added = on_namesrv("addWritePerm", env=ADMIN_ENV)
    assert added.exit_code == 0, added.output
    assert json.loads(added.stdout)[server.namesrv_addr] > 0
