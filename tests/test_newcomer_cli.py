"""A newcomer's commands against a running ``mqlake up``: ``mqlake send`` and ``mqlake consume`` (mqadmin's
sendMessage and consumeMessage), and ``mqlake admin``'s output when piped, as mqadmin prints it."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from broker.client import Admin, ConsumeFromWhere, ConsumeResult, MessageExt, PushConsumer
from broker.remoting.loop import run
from cli.main import app
from tests.aio import poll

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

runner = CliRunner()


def mqlake(*args: str):
    return runner.invoke(app, list(args))


def send_json(server, *args: str) -> list[dict]:
    result = mqlake("send", "-n", server.namesrv_addr, "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def consume_json(server, *args: str) -> list[dict]:
    result = mqlake("consume", "-n", server.namesrv_addr, "--json", *args)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_send_then_consume_from_beginning_prints_every_message_with_its_ids(mqlake_server):
    sent = send_json(mqlake_server, "-t", "FirstHour", "-p", "hello, lake", "--tag", "TagA", "--key", "order-1",
                     "--count", "3")  # fmt: skip
    assert [r["sendStatus"] for r in sent] == ["SEND_OK"] * 3
    assert len({r["msgId"] for r in sent}) == 3

    got = consume_json(mqlake_server, "-t", "FirstHour", "-g", "cg_first_hour", "--from-beginning", "--count", "3")
    assert sorted(m["msgId"] for m in got) == sorted(r["msgId"] for r in sent)
    assert {(m["body"], m["tags"], m["keys"]) for m in got} == {("hello, lake", "TagA", "order-1")}
    by_id = {r["msgId"]: r for r in sent}
    for m in got:  # the queue and offset the SendResult named
        assert (m["queueId"], m["queueOffset"]) == (by_id[m["msgId"]]["queueId"], by_id[m["msgId"]]["queueOffset"])

    # the group committed what it read: without --from-beginning it goes on from there, and has nothing new
    assert consume_json(mqlake_server, "-t", "FirstHour", "-g", "cg_first_hour") == []


def wait_readable(server, topic: str, sent: dict) -> None:
    """Until the broker's queue holds ``sent`` (its dispatch follows the SEND_OK): ``mqlake consume`` without
    ``--count`` reads what the queues hold and stops at the first empty round."""

    async def held() -> bool:
        async with Admin(server.namesrv_addr) as a:
            return any(q.queue_id == sent["queueId"] and q.max_offset > sent["queueOffset"]
                       for q in await a.topic_status(topic))  # fmt: skip

    async def wait() -> None:
        await poll(held, timeout=30, what=f"{topic}'s queue {sent['queueId']} to hold the message", interval=0.05)

    run(wait())


def test_a_group_goes_on_from_its_committed_offset(mqlake_server):
    [before] = send_json(mqlake_server, "-t", "LateGroup", "-p", "before")
    wait_readable(mqlake_server, "LateGroup", before)
    # a new group: the broker answers the queue's first offset while the queue is whole on disk (RocketMQ's rule)
    assert [m["msgId"] for m in consume_json(mqlake_server, "-t", "LateGroup", "-g", "cg_late")] == [before["msgId"]]
    [after] = send_json(mqlake_server, "-t", "LateGroup", "-p", "after")
    [m] = consume_json(mqlake_server, "-t", "LateGroup", "-g", "cg_late", "--count", "1")
    assert (m["msgId"], m["body"]) == (after["msgId"], "after")


def test_plain_output_is_one_line_per_message_with_the_whole_body(mqlake_server):
    body = "x" * 300 + " end"
    [r] = send_json(mqlake_server, "-t", "PlainOut", "-p", body, "--key", "k-plain")
    table = mqlake("send", "-n", mqlake_server.namesrv_addr, "-t", "PlainOut", "-p", "second")
    assert table.exit_code == 0, table.output
    header, row = table.stdout.splitlines()
    assert header.split() == ["#Broker", "Name", "#QID", "#Queue", "Offset", "#Send", "Result", "#MsgId"]
    assert "SEND_OK" in row.split()

    out = mqlake("consume", "-n", mqlake_server.namesrv_addr, "-t", "PlainOut", "--from-beginning", "--count", "2")
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert len(lines) == 2
    [first] = [line for line in lines if r["msgId"] in line]
    assert first.endswith("BODY: " + body) and "KEYS: k-plain" in first

    by_key = mqlake("admin", "queryMsgByKey", "-n", mqlake_server.namesrv_addr, "-t", "PlainOut", "-k", "k-plain")
    assert by_key.exit_code == 0 and by_key.stdout.rstrip().endswith(body), by_key.output  # not cut at 40 bytes

    by_id = mqlake("admin", "queryMsgById", "-n", mqlake_server.namesrv_addr, "-i", r["offsetMsgId"])
    assert by_id.exit_code == 0, by_id.output
    [stored] = [line for line in by_id.stdout.splitlines() if line.startswith("storeTimestamp")]
    assert re.fullmatch(r"storeTimestamp\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \(\d{13}\)\s*", stored), stored


def test_consume_that_gets_too_few_says_what_to_change(mqlake_server):
    send_json(mqlake_server, "-t", "TooFew", "-p", "only one")
    result = mqlake("consume", "-n", mqlake_server.namesrv_addr, "-t", "TooFew", "--from-beginning", "--count", "2",
                    "--wait", "0.5")  # fmt: skip
    assert result.exit_code == 1
    assert "BODY: only one" in result.stdout
    assert "error: received 1 of 2 messages" in result.stderr and "--wait" in result.stderr


def test_send_to_no_namesrv_is_one_error_line():
    result = mqlake("send", "-n", "127.0.0.1:1", "-t", "Nowhere", "-p", "x")
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("error: ") and "127.0.0.1:1" in line and "-n" in line


def test_cluster_list_piped_prints_mqadmin_columns_and_formats(mqlake_server):
    result = mqlake("admin", "clusterList", "-n", mqlake_server.namesrv_addr)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["#Cluster", "Name", "#Broker", "Name", "#BID", "#Addr", "#Version", "#InTPS(LOAD)",
                                "#OutTPS(LOAD)", "#PCWait(ms)", "#Hour", "#SPACE"]  # fmt: skip
    assert not any(c in result.stdout for c in "│┃━─")  # no box outside a terminal
    [row] = [line for line in lines if mqlake_server.broker_addr in line]
    # the TPS as %9.2f(queue size,head wait ms), the hours as %2.2f and the disk ratio as %.4f
    assert re.search(r"\s\d+\.\d\d\(0,0ms\)\s+\d+\.\d\d\(0,0ms\)\s+0\s+\d+\.\d\d\s+\d\.\d{4}\s*$", row), row


def test_consumer_progress_without_group_lists_every_group(mqlake_server):
    send_json(mqlake_server, "-t", "ProgressAll", "-p", "one")
    got: list[bytes] = []

    async def go() -> None:
        c = PushConsumer("cg_progress_all", mqlake_server.namesrv_addr,
                         consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)  # fmt: skip

        def handle(m: MessageExt) -> ConsumeResult:
            got.append(m.body)
            return ConsumeResult.SUCCESS

        c.subscribe("ProgressAll", "*", handle)
        async with c:
            await poll(lambda: got, timeout=30, what="the pushed message", interval=0.05)
            # mqadmin lists the groups that have a retry topic: the broker makes it at the consumer's heartbeat
            async with Admin(mqlake_server.namesrv_addr) as a:
                await poll(lambda: _has_retry_topic(a), timeout=30, what="the group's retry topic", interval=0.1)

    async def _has_retry_topic(a: Admin) -> bool:
        return "%RETRY%cg_progress_all" in await a.topic_list()

    run(go())

    result = mqlake("admin", "consumerProgress", "-n", mqlake_server.namesrv_addr)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["#Group", "#Count", "#Version", "#Type", "#Model", "#TPS", "#Diff", "Total"]
    assert any(line.split()[0] == "cg_progress_all" for line in lines[1:]), result.stdout
    groups = json.loads(mqlake("admin", "consumerProgress", "-n", mqlake_server.namesrv_addr, "--json").stdout)
    [g] = [g for g in groups if g["group"] == "cg_progress_all"]
    assert g["diffTotal"] == 0  # it consumed the one message
