"""``mqlake send`` and ``mqlake consume``: a first message in and out, as mqadmin's ``sendMessage`` and
``consumeMessage`` do, through the project's own client (broker/client/).

``send`` prints one row per message: the broker, queue, queue offset, send status and msgId of its SendResult.
``consume`` prints one line per message as it arrives (msgId, queue, offset, tags, keys, store time, body) and,
with ``--json``, one JSON object per line instead.  Where it starts in each queue: the queue's first message with
``--from-beginning``, else the group's committed offset, else the queue's end.  As in RocketMQ, a group the broker
has no offset for is answered the queue's first offset while all of the queue is still on disk, so a new group
reads a young topic from its start.  It commits what it read for the group: the next run goes on from there.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from store.console import console, print_error, table, time_text
from store.constants import DEFAULT_NAMESRV_ADDR

if TYPE_CHECKING:
    from broker.client import MessageExt, MessageQueue, PullConsumer, SendResult

Namesrv = Annotated[
    str, typer.Option("-n", "--namesrv", envvar="NAMESRV_ADDR", help="NameServer address(es), ';'-separated.")
]
SEND_GROUP = "mqlake_send"
CONSUME_GROUP = "mqlake_consume"
# How long `consume --count N` waits for N messages, and between two empty passes over the queues.
DEFAULT_WAIT_S = 30.0
IDLE_PAUSE_S = 0.2


def body_text(body: bytes) -> str:
    """The body as text where it is UTF-8, else ``hex:`` and its bytes in hex (never cut)."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + body.hex()


def _fail(namesrv: str, e: Exception) -> NoReturn:
    """One ``error:`` line; when no NameServer answered, also where to get one or how to name another."""
    from broker.remoting.errors import RemotingConnectError

    if isinstance(e.__cause__, RemotingConnectError) or isinstance(e, OSError | RemotingConnectError):
        print_error(f"{e}; start one with `mqlake up`, or name another with -n HOST:PORT (or NAMESRV_ADDR)")
    else:
        print_error(e)
    raise typer.Exit(1)


def send(
    topic: Annotated[str, typer.Option("-t", "--topic", help="Topic (created on first send: autoCreateTopicEnable).")],
    body: Annotated[str, typer.Option("-p", "--body", help="Message body (UTF-8 text).")],
    tag: Annotated[str | None, typer.Option("--tag", help="Message tag (TAGS).")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Message key (KEYS), for queryMsgByKey.")] = None,
    count: Annotated[int, typer.Option("--count", min=1, help="Send the body this many times.")] = 1,
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Send a message (mqadmin sendMessage) and print its SendResult."""
    from broker.client import Message, Producer
    from broker.remoting.loop import run
    from store.errors import MQLakeError

    async def go() -> list[SendResult]:
        async with Producer(SEND_GROUP, namesrv) as p:
            return [await p.send(Message(topic, body, tags=tag, keys=key)) for _ in range(count)]

    try:
        results = run(go())
    except (MQLakeError, OSError) as e:
        _fail(namesrv, e)
    if as_json:
        print(json.dumps([{"sendStatus": r.status.value, "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id,
                           "brokerName": r.queue.broker_name, "queueId": r.queue.queue_id,
                           "queueOffset": r.queue_offset} for r in results], indent=2))  # fmt: skip
        return
    t = table("#Broker Name", "#QID", "#Queue Offset", "#Send Result", "#MsgId")
    for r in results:
        t.add_row(r.queue.broker_name, str(r.queue.queue_id), str(r.queue_offset), r.status.value, r.msg_id)
    console().print(t)


def message_line(m: MessageExt) -> str:
    """One received message on one line (its body whole; a newline in it is escaped)."""
    body = body_text(m.body).replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return (f"MSGID: {m.msg_id}  QUEUE: {m.broker_name}:{m.queue_id}  OFFSET: {m.queue_offset}  "
            f"TAGS: {m.tags or '-'}  KEYS: {m.keys or '-'}  STORED: {time_text(m.store_timestamp)}  "
            f"BODY: {body}")  # fmt: skip


async def _start_offsets(c: PullConsumer, queues: list[MessageQueue], from_beginning: bool) -> dict[MessageQueue, int]:
    out = {}
    for mq in queues:
        committed = None if from_beginning else await c.fetch_offset(mq)
        if committed is not None and committed >= 0:
            out[mq] = committed
        elif from_beginning:
            out[mq] = await c.min_offset(mq)
        else:
            out[mq] = await c.max_offset(mq)
    return out


def consume(
    topic: Annotated[str, typer.Option("-t", "--topic", help="Topic to read.")],
    group: Annotated[str, typer.Option("-g", "--group", help="Consumer group whose offsets are used and committed.")
                     ] = CONSUME_GROUP,
    count: Annotated[int | None, typer.Option("--count", min=1, help="Stop after this many messages, waiting up "
                                              "to --wait seconds for them (default: read what is there, stop).")
                     ] = None,
    from_beginning: Annotated[bool, typer.Option("--from-beginning", help="Start at each queue's first message, "
                                                 "not at the group's committed offset.")] = False,
    wait: Annotated[float, typer.Option("--wait", min=0, help="Seconds --count waits for its messages.")
                    ] = DEFAULT_WAIT_S,
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per message and line.")] = False,
) -> None:
    """Read messages of a topic (mqadmin consumeMessage) and print each; commit the group's offsets."""
    import asyncio

    from broker.client import PullConsumer, PullStatus
    from broker.remoting.loop import run
    from store.errors import MQLakeError

    out = console()

    def show(m: MessageExt) -> None:
        if as_json:
            print(json.dumps(m.to_json(), ensure_ascii=False), flush=True)
        else:
            out.print(message_line(m), highlight=False)

    async def go() -> int:
        received = 0
        async with PullConsumer(group, namesrv) as c:
            queues = await c.fetch_queues(topic)
            offsets = await _start_offsets(c, queues, from_beginning)
            deadline = time.monotonic() + wait
            try:
                while count is None or received < count:
                    progressed = False
                    for mq in queues:
                        if count is not None and received >= count:
                            break
                        want = 32 if count is None else min(32, count - received)
                        res = await c.pull(mq, offsets[mq], max_nums=want)
                        if res.status is PullStatus.OFFSET_ILLEGAL:
                            offsets[mq] = res.next_begin_offset
                            continue
                        for m in res.messages[:want]:
                            show(m)
                            received += 1
                            offsets[mq] = m.queue_offset + 1
                            progressed = True
                        if not res.messages and res.status is not PullStatus.NO_NEW_MSG:
                            offsets[mq] = res.next_begin_offset  # filtered out: move past them
                    if not progressed:
                        if count is None or time.monotonic() >= deadline:
                            break
                        await asyncio.sleep(IDLE_PAUSE_S)  # poll again: a pull here never parks at the broker
            finally:
                for mq, off in offsets.items():
                    await c.update_offset(mq, off)
        return received

    try:
        received = run(go())
    except (MQLakeError, OSError) as e:
        _fail(namesrv, e)
    if count is not None and received < count:
        print_error(f"received {received} of {count} messages of {topic} in {wait:g} s; "
                    "give --wait more seconds, or --from-beginning to read what was sent before")  # fmt: skip
        raise typer.Exit(1)
