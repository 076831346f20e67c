"""The plain ACL on the gRPC endpoint against the official 5.x clients, Python (``tests/rmq5.py``) and Java
(rocketmq-client-java 5.2.0, ``tests/java/AclProbe5.java``), on one ``mqlake up`` with ``enableProxy`` and
``aclEnable``: the right secret sends (and receives); a wrong secret, an unknown access key and a client without
credentials are refused UNAUTHORIZED; a topic the account may not publish to is refused FORBIDDEN.  The broker's
own signature and permission checks are those of remoting (``broker.acl``)."""

from __future__ import annotations

import itertools

import pytest

from broker.remoting.signing import Credentials
from tests import rmq5
from tests.fixtures_broker import stop_servers
from tests.peers import JAVA_SOURCES, compile_java, java
from tests.test_acl_broker import write_acl
from tests.test_grpc_clients import ProxyServer, _start

pytestmark = pytest.mark.integration

UNAUTHORIZED, FORBIDDEN = 40100, 40300  # the v2 codes (apache.rocketmq.v2.Code), as the client prints them

ADMIN = Credentials("admin-key", "admin-secret")  # makes the topics and groups over remoting
ACL = {"accounts": [
    {"accessKey": "admin-key", "secretKey": "admin-secret", "admin": True},
    {"accessKey": "client-key", "secretKey": "client-secret", "defaultTopicPerm": "PUB|SUB", "defaultGroupPerm": "SUB",
     "topicPerms": ["Denied=DENY", "ReadOnly=SUB"]},
]}  # fmt: skip
SIGNED = ("--ak", "client-key", "--sk", "client-secret")
_calls = itertools.count()


@pytest.fixture(scope="module")
def acl_proxy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grpc-acl")
    write_acl(tmp / "rocketmq", ACL)
    p = _start(tmp, "up", credentials=ADMIN, aclEnable="true", rocketmqHome=str(tmp / "rocketmq"))
    yield p
    stop_servers([p.server])


def _refused(p: ProxyServer, topic: str, *args: str) -> str:
    """What the client was refused with: its exception and the errors it logged (a refused route lookup reaches
    the caller only as "failed to fetch topic route"; the status it was answered is logged)."""
    home = p.home / f"refused-{next(_calls)}"  # its own log: only this call's errors are read
    out = rmq5.client("produce", p.endpoint, home, "--topic", topic, "--report-error", *args)
    assert "sent" not in out, out
    return "\n".join([f'{out["error"]["type"]}: {out["error"]["message"]}', *out["error"]["logged"]])


def test_the_right_secret_sends_and_receives(acl_proxy) -> None:
    topic, group = acl_proxy.create_topic(), acl_proxy.create_group()
    sent = acl_proxy.client("produce", "--topic", topic, "--count", "2", *SIGNED)["sent"]
    got = acl_proxy.client("receive", "--topic", topic, "--group", group, "--expect", "2", "--ack", *SIGNED)
    assert sorted(m["body"] for m in got["received"]) == ["m-0", "m-1"] and len(sent) == 2


@pytest.mark.parametrize(("args", "reason"), [
    (("--ak", "client-key", "--sk", "a-wrong-secret"), "Check signature failed for accessKey=client-key"),
    (("--ak", "stranger-key", "--sk", "stranger-secret"), "No acl config for stranger-key"),
    ((), "No accessKey is configured"),  # a client without credentials
], ids=["wrong-secret", "unknown-key", "unsigned"])  # fmt: skip
def test_an_unauthenticated_client_is_refused_unauthorized(acl_proxy, args, reason) -> None:
    refused = _refused(acl_proxy, acl_proxy.create_topic(), *args)
    assert f"{UNAUTHORIZED}, {reason}" in refused, refused
    assert not any(s in refused for s in ("a-wrong-secret", "stranger-secret", "client-secret"))


def test_a_topic_the_account_may_not_publish_to_is_forbidden(acl_proxy) -> None:
    # the account holds SUB on ReadOnly (its route is served, its sends refused) and DENY on Denied (not even that)
    refused = _refused(acl_proxy, acl_proxy.create_topic(name="ReadOnly"), *SIGNED)
    assert f"ForbiddenException: {FORBIDDEN}, No default permission for topic:ReadOnly" in refused, refused
    refused = _refused(acl_proxy, acl_proxy.create_topic(name="Denied"), *SIGNED)
    assert f"{FORBIDDEN}, No default permission for topic:Denied" in refused, refused


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return compile_java([JAVA_SOURCES / "AclProbe5.java"], "client-java-5", tmp_path_factory.mktemp("classes"))


def _java_send(p: ProxyServer, probe, topic: str, *credentials: str) -> str:
    """What the Java client printed, then what it logged (under its user.home)."""
    home = p.home / f"java-{next(_calls)}"
    out = java("AclProbe5", "client-java-5", p.endpoint, topic, *credentials, classes=probe, home=home)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + "".join(f.read_text(errors="replace") for f in home.glob("logs/**/*.log"))


@pytest.mark.parametrize(("credentials", "expected"), [
    (("client-key", "client-secret"), "SENT "),
    (("client-key", "a-wrong-secret"), "Check signature failed for accessKey=client-key"),
    (("stranger-key", "stranger-secret"), "No acl config for stranger-key"),
    ((), "No accessKey is configured"),
], ids=["right-secret", "wrong-secret", "unknown-key", "unsigned"])  # fmt: skip
def test_the_java_5x_client_signs_as_the_acl_expects(acl_proxy, probe, credentials, expected) -> None:
    out = _java_send(acl_proxy, probe, acl_proxy.create_topic(), *credentials)
    assert expected in out, out
    if expected != "SENT ":
        assert "UnauthorizedException" in out and "40100" in out, out
        assert not any(s in out for s in ("a-wrong-secret", "stranger-secret", "client-secret")), out


def test_the_java_5x_client_is_forbidden_a_topic_it_may_not_publish_to(acl_proxy, probe) -> None:
    # The refusal reaches this client first on its settings sync (the topic it publishes to needs PUB there too, as
    # RocketMQ 5's proxy checks it): it logs the status and gives up with a cancellation, as against that proxy.
    out = _java_send(acl_proxy, probe, acl_proxy.create_topic(name="ReadOnly"), *SIGNED[1::2])
    assert out.startswith("REFUSED") and "SENT" not in out, out
    assert "code: FORBIDDEN" in out and 'message: "No default permission for topic:ReadOnly"' in out, out
