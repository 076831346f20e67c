"""``mqlake admin``: mqadmin's everyday commands, with its camelCase names and short options.

Every command takes ``-n/--namesrv`` (default ``$NAMESRV_ADDR``, else 127.0.0.1:9876, ``;``-separated for
several) and ``--json`` (one JSON document on stdout instead of a table).  Errors go to stderr with exit code 1.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.table import Table

from store.console import console, print_error, table

if TYPE_CHECKING:  # the client is imported when a command runs: `mqlake up` need not pay for it
    from broker.client.admin import Admin, BrokerInfo, QueueProgress, QueueStatus
    from broker.client.message import MessageExt

admin_app = typer.Typer(
    help="Administer topics, messages, consumers and clusters (mqadmin's commands).", no_args_is_help=True
)


T = TypeVar("T")

Namesrv = Annotated[
    str, typer.Option("-n", "--namesrv", envvar="NAMESRV_ADDR", help="NameServer address(es), ';'-separated.")
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _call(namesrv: str, fn: Callable[[Admin], Awaitable[T]]) -> T:
    from broker.client.admin import Admin
    from broker.remoting.loop import run
    from store.errors import MQLakeError

    async def go() -> T:
        async with Admin(namesrv) as admin:
            return await fn(admin)

    try:
        return run(go())
    # the client's and the wire's errors, and a reply that does not parse (RecordError, RouteError, HeaderError, ...)
    except MQLakeError as e:
        print_error(e)
        raise typer.Exit(1) from None


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3] if ms > 0 else "-"


# -- renderers (pure: rows in, rich Table out) ------------------------------------------------------------------


def topic_status_table(rows: list[QueueStatus]) -> Table:
    t = table("#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated")
    for r in rows:
        t.add_row(r.broker_name, str(r.queue_id), str(r.min_offset), str(r.max_offset), _time(r.last_update_timestamp))
    return t


def messages_table(msgs: list[MessageExt]) -> Table:
    t = table("#Message ID", "#Offset Msg ID", "#QID", "#Offset", "#Tags", "#Keys", "#Store Time", "#Body")
    for m in msgs:
        body = m.body[:40].decode("utf-8", "replace")
        t.add_row(m.msg_id, m.offset_msg_id, str(m.queue_id), str(m.queue_offset), m.tags or "", m.keys or "",
                  _time(m.store_timestamp), body)  # fmt: skip
    return t


def message_detail_table(m: MessageExt) -> Table:
    t = table("Field", "Value", show_header=False)
    for k, v in m.to_json().items():
        t.add_row(k, json.dumps(v, ensure_ascii=False) if isinstance(v, dict) else str(v))
    return t


def consumer_progress_table(rows: list[QueueProgress]) -> Table:
    t = table("#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff", "#LastTime")
    for r in rows:
        t.add_row(r.topic, r.broker_name, str(r.queue_id), str(r.broker_offset), str(r.consumer_offset), str(r.lag),
                  _time(r.last_timestamp))  # fmt: skip
    t.caption = f"Diff Total: {sum(r.lag for r in rows)}"
    return t


def cluster_table(rows: list[BrokerInfo]) -> Table:
    t = table("#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#InTPS", "#OutTPS", "#Msgs in CommitLog")
    for r in rows:
        rt = r.runtime
        t.add_row(r.cluster, r.broker_name, str(r.broker_id), r.addr, rt.get("brokerVersionDesc", "-"),
                  rt.get("putTps", "-").split(" ")[0], rt.get("getTransferedTps", rt.get("getTransferredTps", "-"))
                  .split(" ")[0], rt.get("commitLogMaxOffset", "-"))  # fmt: skip
    return t


# -- commands ------------------------------------------------------------------------------------------------


@admin_app.command("updateTopic")
def update_topic(
    topic: Annotated[str, typer.Option("-t", "--topic", help="Topic name.")],
    namesrv: Namesrv = "127.0.0.1:9876",
    cluster: Annotated[str | None, typer.Option("-c", "--clusterName", help="Create on every master of it.")] = None,
    broker_addr: Annotated[str | None, typer.Option("-b", "--brokerAddr", help="Create on this broker.")] = None,
    read_queue_nums: Annotated[int, typer.Option("-r", "--readQueueNums", min=1)] = 8,
    write_queue_nums: Annotated[int, typer.Option("-w", "--writeQueueNums", min=1)] = 8,
    perm: Annotated[int, typer.Option("-p", "--perm", help="2 write, 4 read, 6 read+write.")] = 6,
    order: Annotated[bool, typer.Option("-o", "--order")] = False,
    as_json: AsJson = False,
) -> None:
    """Create or update a topic on a broker (-b) or on every broker of a cluster (-c)."""
    if (cluster is None) == (broker_addr is None):
        print_error("give exactly one of -c/--clusterName or -b/--brokerAddr")
        raise typer.Exit(2)
    addrs = _call(namesrv, lambda a: a.create_topic(
        topic, cluster=cluster, broker_addr=broker_addr, read_queue_nums=read_queue_nums,
        write_queue_nums=write_queue_nums, perm=perm, order=order,
    ))  # fmt: skip
    result = {"topic": topic, "readQueueNums": read_queue_nums, "writeQueueNums": write_queue_nums, "perm": perm,
              "brokers": addrs}  # fmt: skip
    if as_json:
        _print_json(result)
    else:
        for addr in addrs:
            console().print(f"create topic to {addr} success.")
        console().print(f"TopicConfig [topicName={topic}, readQueueNums={read_queue_nums}, "
                      f"writeQueueNums={write_queue_nums}, perm={perm}]")  # fmt: skip


@admin_app.command("topicList")
def topic_list(namesrv: Namesrv = "127.0.0.1:9876", as_json: AsJson = False) -> None:
    """Every topic the NameServer knows."""
    topics = _call(namesrv, lambda a: a.topic_list())
    if as_json:
        _print_json(topics)
    else:
        for t in topics:
            console().print(t, markup=False, highlight=False)


@admin_app.command("topicStatus")
def topic_status(
    topic: Annotated[str, typer.Option("-t", "--topic")], namesrv: Namesrv = "127.0.0.1:9876", as_json: AsJson = False
) -> None:
    """Per queue min/max offset and last update time."""
    rows = _call(namesrv, lambda a: a.topic_status(topic))
    if as_json:
        _print_json([_status_json(r) for r in rows])
    else:
        console().print(topic_status_table(rows))


def _status_json(r: QueueStatus) -> dict[str, object]:
    return {"topic": r.topic, "brokerName": r.broker_name, "queueId": r.queue_id, "minOffset": r.min_offset,
            "maxOffset": r.max_offset, "lastUpdateTimestamp": r.last_update_timestamp}  # fmt: skip


@admin_app.command("queryMsgByKey")
def query_msg_by_key(
    topic: Annotated[str, typer.Option("-t", "--topic")],
    key: Annotated[str, typer.Option("-k", "--msgKey")],
    namesrv: Namesrv = "127.0.0.1:9876",
    begin: Annotated[int, typer.Option("-b", "--beginTimestamp", help="ms; default 0")] = 0,
    end: Annotated[int | None, typer.Option("-e", "--endTimestamp", help="ms; default now")] = None,
    max_num: Annotated[int, typer.Option("-c", "--maxNum")] = 64,
    as_json: AsJson = False,
) -> None:
    """Messages of a topic by KEYS (through the IndexFile)."""
    msgs = _call(namesrv, lambda a: a.query_msg_by_key(topic, key, max_num, begin, end))
    if as_json:
        _print_json([m.to_json() for m in msgs])
    else:
        console().print(messages_table(msgs))


@admin_app.command("queryMsgById")
def query_msg_by_id(
    msg_id: Annotated[str, typer.Option("-i", "--msgId", help="Offset msgId or UNIQ_KEY.")],
    namesrv: Namesrv = "127.0.0.1:9876",
    topic: Annotated[str | None, typer.Option("-t", "--topic", help="Topic of a UNIQ_KEY id (else all).")] = None,
    as_json: AsJson = False,
) -> None:
    """A message by its broker offset id, or by the producer's UNIQ_KEY id."""
    msgs = _call(namesrv, lambda a: a.query_msg_by_id(msg_id, topic))
    if not msgs:
        print_error(f"no message with id {msg_id}")
        raise typer.Exit(1)
    if as_json:
        _print_json([m.to_json() for m in msgs])
    else:
        for m in msgs:
            console().print(message_detail_table(m))


@admin_app.command("consumerProgress")
def consumer_progress(
    group: Annotated[str, typer.Option("-g", "--groupName")],
    namesrv: Namesrv = "127.0.0.1:9876",
    topic: Annotated[str | None, typer.Option("-t", "--topicName")] = None,
    as_json: AsJson = False,
) -> None:
    """Per queue broker offset, consumer offset and lag of a consumer group."""
    rows = _call(namesrv, lambda a: a.consumer_progress(group, topic))
    if as_json:
        _print_json({"group": group, "diffTotal": sum(r.lag for r in rows), "queues": [r.to_json() for r in rows]})
    else:
        console().print(consumer_progress_table(rows))


@admin_app.command("clusterList")
def cluster_list(namesrv: Namesrv = "127.0.0.1:9876", as_json: AsJson = False) -> None:
    """Brokers per cluster with their runtime figures."""
    rows = _call(namesrv, lambda a: a.cluster_list())
    if as_json:
        _print_json([{"cluster": r.cluster, "brokerName": r.broker_name, "brokerId": r.broker_id, "addr": r.addr,
                      "runtime": r.runtime} for r in rows])  # fmt: skip
    else:
        console().print(cluster_table(rows))
