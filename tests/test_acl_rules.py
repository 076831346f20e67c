"""The plain ACL without a broker: signature vectors, address patterns, plain_acl.yml parsing and its errors,
the per-request resources and the refusal order, and the safety settings broker.conf refuses."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path

import pytest

from broker.acl.access import Rules, resources
from broker.acl.addresses import AddressPatternError, compile_pattern
from broker.acl.rules import DENY, PUB, SUB, AclConfigError, parse_acl, read_acl
from broker.config import BrokerConfigError, build_configs
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestRefused
from broker.remoting.signing import Credentials, signature, signed_content

SECRET = "12345678"


# --- signatures ---------------------------------------------------------------------------------------------------


def java_hook_signature(ext: dict[str, str], body: bytes, secret: str) -> str:
    """AclClientRPCHook, written out here on its own: the ext fields in a TreeMap (sorted by key), every value
    but Signature's concatenated, UTF-8, the body appended; HmacSHA1 under the secret; base64."""
    content = "".join(v for k, v in sorted(ext.items()) if k != "Signature").encode("utf-8") + body
    return base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()


@pytest.mark.unit
def test_signature_matches_vectors_computed_with_openssl() -> None:
    # printf 'RocketMQpg3TopicTestHello' | openssl dgst -sha1 -hmac 12345678 -binary | base64
    cmd = RemotingCommand.request(10, ext={"topic": "TopicTest", "producerGroup": "pg", "queueId": "3"}, body=b"Hello")
    Credentials("RocketMQ", SECRET).sign(cmd)
    assert cmd.ext_fields["AccessKey"] == "RocketMQ"
    assert cmd.ext_fields["Signature"] == "s3EixBEsFBk8ZRr+Nrt6CIhjwF0="
    # with a SecurityToken (it sorts between AccessKey and the lower-case keys):
    # printf 'RocketMQtokenXYZpg3TopicTestHello' | openssl dgst -sha1 -hmac 12345678 -binary | base64
    cmd = RemotingCommand.request(10, ext={"topic": "TopicTest", "producerGroup": "pg", "queueId": "3"}, body=b"Hello")
    Credentials("RocketMQ", SECRET, security_token="tokenXYZ").sign(cmd)
    assert cmd.ext_fields["Signature"] == "Q60uIddEVHTorw4zM8T3doEwzfI="
    # AclSignerTest's input: printf 'RocketMQ' | openssl dgst -sha1 -hmac 12345678 -binary | base64
    assert signature(b"RocketMQ", SECRET) == "IUc8rrO/0gDch8CjObLQsW2rsiA="
    # a secret longer than SHA-1's 64-byte block is hashed first (RFC 2104):
    # printf 'RocketMQ' | openssl dgst -sha1 -hmac "$(printf 'k%.0s' $(seq 1 100))" -binary | base64
    assert signature(b"RocketMQ", "k" * 100) == "xFSAPpBbYfFlf9SijBJWnuHKOOw="


@pytest.mark.unit
def test_signature_covers_every_ext_field_and_the_body_and_ignores_an_old_signature() -> None:
    # OnsChannel is what the C++ client's session credentials add: any ext field is covered alike
    ext = {"a": "pg", "b": "T", "c": "TBW102", "UNIQ": "ü", "AccessKey": "RocketMQ", "OnsChannel": "ALIYUN",
           "Signature": "stale"}  # fmt: skip
    cmd = RemotingCommand.request(310, ext=dict(ext), body=b"\x00\xffbody")
    Credentials("RocketMQ", SECRET).sign(cmd)
    assert cmd.ext_fields["Signature"] == java_hook_signature(ext, b"\x00\xffbody", SECRET)
    assert signed_content({"b": "2", "a": "1", "Signature": "x"}, b"!") == b"12!"


@pytest.mark.unit
def test_credentials_repr_hides_the_secret() -> None:
    creds = Credentials("RocketMQ", "very-secret-value", "token-value")
    assert "very-secret-value" not in repr(creds) and "token-value" not in repr(creds)


# --- address patterns ---------------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("pattern", "inside", "outside"),
    [
        ("*", ["10.0.0.1", "::1"], []),
        ("192.168.*.*", ["192.168.0.1", "192.168.255.255"], ["192.169.0.1", "10.168.0.1"]),
        ("192.168.1.1-10", ["192.168.1.1", "192.168.1.10"], ["192.168.1.11", "192.168.1.0", "192.168.2.5"]),
        ("192.168.1-3.*", ["192.168.3.200"], ["192.168.4.1"]),
        ("192.168.1.{1,2,7}", ["192.168.1.7"], ["192.168.1.3"]),
        ("10.0.0.1,10.0.0.9", ["10.0.0.9"], ["10.0.0.2"]),
        ("127.0.0.1", ["127.0.0.1", "::ffff:127.0.0.1"], ["127.0.0.2"]),
        ("2001:db8::1", ["2001:0db8:0:0:0:0:0:1"], ["2001:db8::2"]),
        ("", [], ["127.0.0.1"]),
    ],
)
def test_address_patterns_match_as_rocketmq_reads_them(pattern: str, inside: list[str], outside: list[str]) -> None:
    compiled = compile_pattern(pattern)
    assert all(compiled.matches(ip) for ip in inside)
    assert not any(compiled.matches(ip) for ip in outside)


@pytest.mark.unit
@pytest.mark.parametrize("pattern", ["192.168.1", "192.168.1.300", "192.168.1.10-2", "*.168.1.1x", "host.name",
                                     "192.168.1.{}", "fe80::*"])  # fmt: skip
def test_bad_address_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(AddressPatternError, match="address pattern"):
        compile_pattern(pattern)


# --- plain_acl.yml -------------------------------------------------------------------------------------------------

GOOD = """\
globalWhiteRemoteAddresses:
- 10.10.103.*
accounts:
- accessKey: RocketMQ
  secretKey: 12345678
  whiteRemoteAddress:
  admin: false
  defaultTopicPerm: DENY
  defaultGroupPerm: SUB
  topicPerms:
  - topicA=DENY
  - topicB=PUB|SUB
  - topicC=SUB
  groupPerms:
  - groupA=DENY
  - groupB=PUB|SUB
- accessKey: rocketmq2
  secretKey: "12345678"
  whiteRemoteAddress: 192.168.1.*
  admin: true
"""


@pytest.mark.unit
def test_rocketmq_sample_file_parses_with_its_permissions() -> None:
    acl = parse_acl(GOOD, "plain_acl.yml")
    rules = Rules.compile(acl)
    first = rules.accounts["RocketMQ"]
    assert first.secret_key == b"12345678"  # YAML's number read as the text it was
    assert (first.default_topic_perm, first.default_group_perm) == (DENY, SUB)
    assert first.perms == {"topicA": DENY, "topicB": PUB | SUB, "topicC": SUB, "%RETRY%groupA": DENY,
                           "%RETRY%groupB": PUB | SUB}  # fmt: skip
    assert rules.accounts["rocketmq2"].admin
    assert rules.white[0].matches("10.10.103.7")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("accounts:\n- accessKey: RocketMQ\n  secretKey: [oops\n", 4, "not valid YAML"),
        (
            "accounts:\n- accessKey: RocketMQ\n  secretKey: 1234567890\n  topicPerms:\n  - topicA=READ\n",
            5,
            "topicA=READ",
        ),
        ("accounts:\n- accessKey: short\n  secretKey: 1234567890\n", 2, "accounts.0.accessKey"),
        ("globalWhiteRemoteAddresses:\n- 1.2.3\n", 2, "1.2.3"),
        ("accounts:\n- accessKey: RocketMQ\n  secretKey: 1234567890\n  colour: red\n", 4, "colour"),
        (
            "accounts:\n- accessKey: RocketMQ\n  secretKey: 1234567890\n"
            "- accessKey: RocketMQ\n  secretKey: 0987654321\n",
            2,
            "appears twice",
        ),
        ("- just\n- a list\n", 1, "must be a mapping"),
    ],
)
def test_bad_files_name_the_file_and_line(text: str, line: int, what: str) -> None:
    with pytest.raises(AclConfigError) as err:
        parse_acl(text, "/etc/rmq/conf/plain_acl.yml")
    message = str(err.value)
    assert message.startswith(f"/etc/rmq/conf/plain_acl.yml:{line}:"), message
    assert what in message
    assert "1234567890" not in message and "0987654321" not in message  # never a secret


@pytest.mark.unit
def test_missing_and_non_utf8_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(AclConfigError, match=r"plain_acl\.yml: cannot read"):
        read_acl(tmp_path / "plain_acl.yml")
    bad = tmp_path / "bad.yml"
    bad.write_bytes(b"accounts:\n- accessKey: \xff\xfe\n")
    with pytest.raises(AclConfigError, match=r"bad\.yml:2: not UTF-8"):
        read_acl(bad)


# --- resources and refusals ---------------------------------------------------------------------------------------


def _cmd(code: int, body: bytes = b"", **ext: str) -> RemotingCommand:
    return RemotingCommand.request(code, ext=ext, body=body)


@pytest.mark.unit
def test_resources_per_request_code() -> None:
    assert resources(_cmd(RequestCode.SEND_MESSAGE, topic="T", producerGroup="pg")) == {"T": PUB}
    assert resources(_cmd(RequestCode.SEND_MESSAGE_V2, a="pg", b="T")) == {"T": PUB}
    assert resources(_cmd(RequestCode.SEND_BATCH_MESSAGE, a="pg", b="T")) == {"T": PUB}
    assert resources(_cmd(RequestCode.SEND_MESSAGE_V2, a="pg", b="%RETRY%G")) == {"%RETRY%G": SUB}
    assert resources(_cmd(RequestCode.RECALL_MESSAGE, topic="T", recallHandle="h")) == {"T": PUB}
    assert resources(_cmd(RequestCode.PULL_MESSAGE, topic="T", consumerGroup="G")) == {"T": SUB, "%RETRY%G": SUB}
    for code in (RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.QUERY_CONSUMER_OFFSET):
        assert resources(_cmd(code, topic="T", consumerGroup="G", queueId="0")) == {"T": SUB, "%RETRY%G": SUB}
    assert resources(_cmd(RequestCode.CONSUMER_SEND_MSG_BACK, group="G")) == {"%RETRY%G": SUB}
    assert resources(_cmd(RequestCode.QUERY_MESSAGE, topic="T")) == {"T": SUB}
    assert resources(_cmd(RequestCode.GET_CONSUMER_LIST_BY_GROUP, consumerGroup="G")) == {"%RETRY%G": SUB}
    heartbeat = json.dumps({"clientID": "c", "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": [
        {"topic": "T", "subString": "*"}, {"topic": "%RETRY%G", "subString": "*"}]}]}).encode()  # fmt: skip
    assert resources(_cmd(RequestCode.HEART_BEAT, heartbeat)) == {"%RETRY%G": SUB, "T": SUB}
    assert resources(_cmd(RequestCode.GET_MAX_OFFSET, topic="T")) == {}


def _refusal(rules: Rules, cmd: RemotingCommand, ip: str = "127.0.0.1") -> str:
    with pytest.raises(RequestRefused) as err:
        rules.check(cmd, ip)
    assert err.value.code == ResponseCode.NO_PERMISSION
    return err.value.remark


@pytest.mark.unit
def test_refusals_in_rocketmq_order_with_its_remarks() -> None:
    rules = Rules.compile(parse_acl(GOOD, "plain_acl.yml"))
    signer = Credentials("RocketMQ", "12345678")
    assert _refusal(rules, _cmd(RequestCode.SEND_MESSAGE_V2, a="pg", b="topicB")) == "No accessKey is configured"
    assert _refusal(rules, _cmd(RequestCode.SEND_MESSAGE_V2, a="pg", b="topicB", AccessKey="nobody00")) == \
        "No acl config for nobody00"  # fmt: skip
    forged = _cmd(RequestCode.SEND_MESSAGE_V2, a="pg", b="topicB")
    Credentials("RocketMQ", "wrong-secret").sign(forged)
    remark = _refusal(rules, forged)
    assert remark == "Check signature failed for accessKey=RocketMQ" and "12345678" not in remark
    denied = _cmd(RequestCode.SEND_MESSAGE_V2, a="pg", b="topicA")
    signer.sign(denied)
    assert _refusal(rules, denied) == "No default permission for topic:topicA"
    by_default = _cmd(RequestCode.SEND_MESSAGE_V2, a="pg", b="other")
    signer.sign(by_default)
    assert _refusal(rules, by_default) == "No default permission for topic:other"  # defaultTopicPerm: DENY
    pull = _cmd(RequestCode.PULL_MESSAGE, topic="topicC", consumerGroup="groupA")
    signer.sign(pull)
    assert _refusal(rules, pull) == "No default permission for group:groupA"
    admin = _cmd(RequestCode.UPDATE_AND_CREATE_TOPIC, topic="X")
    signer.sign(admin)
    assert _refusal(rules, admin) == "Need admin permission for request code=17, but accessKey=RocketMQ is not"
    for code in (RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, RequestCode.CLONE_GROUP_OFFSET,
                 RequestCode.DELETE_EXPIRED_COMMITLOG):
        operator = _cmd(code, topic="topicC", group="groupB")
        signer.sign(operator)
        remark = _refusal(rules, operator)
        assert remark == f"Need admin permission for request code={code}, but accessKey=RocketMQ is not"
    consumer = {"groupName": "groupA", "subscriptionDataSet": [{"topic": "topicC", "subString": "*"}]}
    heartbeat = _cmd(RequestCode.HEART_BEAT, json.dumps({"clientID": "c", "consumerDataSet": [consumer]}).encode())
    signer.sign(heartbeat)
    assert _refusal(rules, heartbeat) == "No default permission for group:groupA"
    ok = _cmd(RequestCode.PULL_MESSAGE, topic="topicC", consumerGroup="groupB")
    signer.sign(ok)
    rules.check(ok, "127.0.0.1")
    rules.check(_cmd(RequestCode.SEND_MESSAGE_V2, a="pg", b="topicA"), "10.10.103.9")  # global white list
    # rocketmq2 is white-listed for 192.168.1.*: no signature needed from there, and admin codes pass
    rules.check(_cmd(RequestCode.UPDATE_AND_CREATE_TOPIC, AccessKey="rocketmq2"), "192.168.1.20")
    assert _refusal(rules, _cmd(RequestCode.UPDATE_AND_CREATE_TOPIC, AccessKey="rocketmq2"), "192.168.2.20") == \
        "Check signature failed for accessKey=rocketmq2"  # fmt: skip


@pytest.mark.unit
def test_tampered_and_oversized_requests_are_refused() -> None:
    rules = Rules.compile(parse_acl(GOOD, "plain_acl.yml"))
    signed = _cmd(RequestCode.SEND_MESSAGE_V2, b"the whole body", a="pg", b="topicB")
    Credentials("RocketMQ", "12345678").sign(signed)
    rules.check(signed, "127.0.0.1")
    truncated = _cmd(RequestCode.SEND_MESSAGE_V2, b"the whole", **signed.ext_fields)
    assert _refusal(rules, truncated).startswith("Check signature failed")
    replayed = _cmd(RequestCode.SEND_MESSAGE_V2, b"another body!!", **signed.ext_fields)
    assert _refusal(rules, replayed).startswith("Check signature failed")
    moved = _cmd(RequestCode.SEND_MESSAGE_V2, b"the whole body", **{**signed.ext_fields, "b": "topicC"})
    assert _refusal(rules, moved).startswith("Check signature failed")
    huge = _cmd(RequestCode.SEND_MESSAGE_V2, a="pg", b="topicB", AccessKey="K" * 100_000, Signature="x")
    remark = _refusal(rules, huge)
    assert "longer than" in remark and len(remark) < 200


# --- broker.conf safety settings ------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("conf", "key"),
    [
        ({"brokerRole": "SLAVE"}, "brokerRole"),  # a slave without a brokerId of its own
        ({"brokerRole": "MASTER"}, "brokerRole"),
        ({"enableDLegerCommitLog": "true"}, "enableDLegerCommitLog"),
        ({"aclEnable": "true", "rocketmqHome": ""}, "rocketmqHome"),
        ({"tls.server.mode": "enforcing"}, "tls.server.certPath"),
        ({"tls.server.mode": "sometimes"}, "tls.server.mode"),
    ],
)
def test_settings_the_broker_cannot_honour_stop_start_up(conf: dict[str, str], key: str) -> None:
    with pytest.raises(BrokerConfigError) as err:
        build_configs(conf, "broker.conf")
    assert str(err.value).startswith("broker.conf: ") and key in str(err.value)


@pytest.mark.unit
def test_async_master_and_acl_home_are_accepted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROCKETMQ_HOME", str(tmp_path))
    broker, _ = build_configs({"brokerRole": "ASYNC_MASTER", "aclEnable": "true", "enableDLegerCommitLog": "false"})
    assert broker.acl_enable and broker.acl_file == tmp_path / "conf" / "plain_acl.yml"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("conf", "expected", "code"),
    [
        ("brokerRole=SLAVE\n", "brokerRole=SLAVE needs brokerId > 0", 2),
        ("enableDLegerCommitLog=true\n", "enableDLegerCommitLog=true is not supported", 2),
        ("aclEnable=true\nrocketmqHome={home}\n", "{home}/conf/plain_acl.yml: cannot read the ACL file", 1),
    ],
)
def test_mqlake_broker_refuses_to_start(tmp_path: Path, conf: str, expected: str, code: int) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    path = tmp_path / "broker.conf"
    path.write_text(conf.format(home=tmp_path) + f"listenPort=0\nstorePathRootDir={tmp_path / 'store'}\n")
    result = CliRunner().invoke(app, ["broker", "-c", str(path)])
    assert result.exit_code == code
    assert expected.format(home=tmp_path) in result.output
    assert not (tmp_path / "store").exists()  # refused before the store was touched


@pytest.mark.unit
def test_unique_key_queries_pass_signed_either_way() -> None:
    # RocketMQ's validator leaves _UNIQUE_KEY_QUERY out of the content while its client hook signs it
    rules = Rules.compile(parse_acl(GOOD, "plain_acl.yml"))
    by_hook = _cmd(RequestCode.QUERY_MESSAGE, topic="topicC", key="k", maxNum="32", beginTimestamp="0",
                   endTimestamp="1", _UNIQUE_KEY_QUERY="true")  # fmt: skip
    Credentials("RocketMQ", "12345678").sign(by_hook)
    rules.check(by_hook, "127.0.0.1")
    by_validator = _cmd(RequestCode.QUERY_MESSAGE, **{k: v for k, v in by_hook.ext_fields.items() if k != "Signature"})
    content = "".join(v for k, v in sorted(by_validator.ext_fields.items()) if k != "_UNIQUE_KEY_QUERY").encode()
    by_validator.ext_fields["Signature"] = java_hook_signature({"c": content.decode()}, b"", SECRET)
    rules.check(by_validator, "127.0.0.1")
    by_validator.ext_fields["_UNIQUE_KEY_QUERY"] = "false"  # the flag is not covered: changing it passes, as in Java
    rules.check(by_validator, "127.0.0.1")
    by_validator.ext_fields["topic"] = "topicB"
    assert _refusal(rules, by_validator).startswith("Check signature failed")


# --- the broker's own signing account, and the NameServer's ACL settings ----------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "problem"),
    [("admin-key:admin-secret", "not JSON"), ('{"accessKey":"admin-key"}', "secretKey"),
     ('{"accessKey":"admin-key","secretKey":"admin-secret","extra":1}', "extra")],
)  # fmt: skip
def test_bad_inner_credentials_stop_start_up_without_echoing_the_secret(value: str, problem: str) -> None:
    with pytest.raises(BrokerConfigError, match=problem) as err:
        build_configs({"innerClientAuthenticationCredentials": value}, "broker.conf")
    assert "innerClientAuthenticationCredentials" in str(err.value) and "admin-secret" not in str(err.value)


@pytest.mark.unit
def test_inner_credentials_are_read_and_never_shown() -> None:
    from broker.server.runtime_config import all_configs

    broker, store = build_configs(
        {"innerClientAuthenticationCredentials": '{"accessKey":"admin-key","secretKey":"admin-secret"}'}
    )
    creds = broker.inner_client_authentication_credentials
    assert creds is not None and (creds.access_key, creds.secret_key) == ("admin-key", "admin-secret")
    shown = all_configs(broker, store)  # what GET_BROKER_CONFIG answers
    assert "innerClientAuthenticationCredentials" not in shown and "admin-secret" not in repr(broker)
    assert "admin-secret" not in "".join(shown.values())


@pytest.mark.unit
def test_namesrv_conf_reads_the_acl_keys(tmp_path: Path) -> None:
    from broker.config import load_namesrv_conf

    conf = tmp_path / "namesrv.conf"
    conf.write_text(f"aclEnable=true\nrocketmqHome={tmp_path}\n", encoding="latin-1")
    loaded = load_namesrv_conf(conf)
    assert loaded.acl_enable and loaded.acl_file == tmp_path / "conf" / "plain_acl.yml"
    assert not load_namesrv_conf(None).acl_enable
    conf.write_text("aclEnable=true\nrocketmqHome=\n", encoding="latin-1")
    with pytest.raises(BrokerConfigError, match="rocketmqHome"):
        load_namesrv_conf(conf)


@pytest.mark.unit
def test_mqlake_namesrv_with_acl_refuses_to_start_without_its_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    conf = tmp_path / "namesrv.conf"
    conf.write_text(f"aclEnable=true\nrocketmqHome={tmp_path}\n", encoding="latin-1")
    result = CliRunner().invoke(app, ["namesrv", "--port", "0", "-c", str(conf)])
    assert result.exit_code == 1
    assert f"{tmp_path}/conf/plain_acl.yml: cannot read the ACL file" in result.output


@pytest.mark.unit
def test_check_admin_and_checks_on_what_a_handler_read() -> None:
    rules = Rules.compile(parse_acl(GOOD, "plain_acl.yml"))
    signed = _cmd(RequestCode.PUT_KV_CONFIG, namespace="n", key="k", value="v")
    Credentials("RocketMQ", "12345678").sign(signed)
    with pytest.raises(RequestRefused, match="Need admin permission for request code=100, but accessKey=RocketMQ"):
        rules.check_admin(signed, "127.0.0.1")
    rules.check_admin(_cmd(RequestCode.PUT_KV_CONFIG), "10.10.103.7")  # a globally white-listed peer
    view = _cmd(RequestCode.VIEW_MESSAGE_BY_ID, offset="0")
    Credentials("RocketMQ", "12345678").sign(view)
    rules.check(view, "127.0.0.1")  # the request alone names no topic
    rules.check(view, "127.0.0.1", {"topicB": SUB})
    with pytest.raises(RequestRefused, match="No default permission for topic:topicA"):
        rules.check(view, "127.0.0.1", {"topicA": SUB})


@pytest.mark.unit
def test_credentials_recognise_their_own_signature_only() -> None:
    mine, other = Credentials("inner-key", "inner-secret"), Credentials("inner-key", "other-secret")
    cmd = _cmd(RequestCode.REGISTER_BROKER, b"body", brokerName="broker-a")
    assert not mine.signed(cmd)
    mine.sign(cmd)
    assert mine.signed(cmd) and not other.signed(cmd)
    cmd.ext_fields["brokerName"] = "broker-b"
    assert not mine.signed(cmd)
