"""``mqlake admin`` operator commands, named and optioned as mqadmin's: deleteTopic, updateSubGroup,
deleteSubGroup, resetOffsetByTime, cloneGroupOffset, consumerStatus, consumerConnection, producerConnection,
queryMsgByOffset, topicRoute, brokerStatus, getBrokerConfig, updateBrokerConfig, wipeWritePerm, addWritePerm,
deleteExpiredCommitLog, statsAll. They join ``admin_app`` when this module is imported (cli/main.py does)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from cli.admin import AsJson, Namesrv, _call, _print_json, admin_app, done, message_detail_table, one_target
from store.console import console, print_error, table
from store.constants import DEFAULT_NAMESRV_ADDR

if TYPE_CHECKING:
    from broker.client.ops import OpsAdmin

T = TypeVar("T")

Cluster = Annotated[str | None, typer.Option("-c", "--clusterName", help="Every master of this cluster.")]
BrokerAddr = Annotated[str | None, typer.Option("-b", "--brokerAddr", help="This broker (host:port).")]


def _ops(namesrv: str, fn: Callable[[OpsAdmin], Awaitable[T]]) -> T:
    from broker.client.ops import OpsAdmin

    return _call(namesrv, fn, OpsAdmin)


def _java_bool(text: str) -> bool:
    """mqadmin's boolean option values (``Boolean.parseBoolean``)."""
    return text.strip().lower() == "true"


def parse_timestamp(text: str) -> int:
    """mqadmin's ``-s``: ``now``, milliseconds, or ``yyyy-MM-dd#HH:mm:ss:SSS``."""
    if text == "now":
        return int(datetime.now().timestamp() * 1000)
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return int(datetime.strptime(text, "%Y-%m-%d#%H:%M:%S:%f").timestamp() * 1000)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected now, milliseconds or yyyy-MM-dd#HH:mm:ss:SSS") from None


@admin_app.command("deleteTopic")
def delete_topic(
    topic: Annotated[str, typer.Option("-t", "--topic")],
    cluster: Annotated[str, typer.Option("-c", "--clusterName")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    as_json: AsJson = False,
) -> None:
    """Delete a topic on every master of a cluster and in the NameServers."""
    addrs = _ops(namesrv, lambda a: a.delete_topic(topic, cluster))
    done(as_json, {"topic": topic, "brokers": addrs},
         [f"delete topic [{topic}] from cluster [{cluster}] success.",
          f"delete topic [{topic}] from NameServer success."])  # fmt: skip


@admin_app.command("updateSubGroup")
def update_sub_group(
    group: Annotated[str, typer.Option("-g", "--groupName")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    cluster: Cluster = None,
    broker_addr: BrokerAddr = None,
    consume_enable: Annotated[str, typer.Option("-s", "--consumeEnable", help="true/false")] = "true",
    consume_from_min_enable: Annotated[str, typer.Option("-m", "--consumeFromMinEnable")] = "false",
    consume_broadcast_enable: Annotated[str, typer.Option("-d", "--consumeBroadcastEnable")] = "false",
    retry_queue_nums: Annotated[int, typer.Option("-q", "--retryQueueNums", min=1)] = 1,
    retry_max_times: Annotated[int, typer.Option("-r", "--retryMaxTimes", min=-1)] = 16,
    broker_id: Annotated[int, typer.Option("-i", "--brokerId")] = 0,
    slowly_broker_id: Annotated[int, typer.Option("-w", "--whichBrokerWhenConsumeSlowly")] = 1,
    notify: Annotated[str, typer.Option("-a", "--notifyConsumerIdsChanged")] = "true",
    orderly: Annotated[str, typer.Option(
        "-o", "--consumeMessageOrderly", help="true: a FIFO group (5.x clients get its messages in order)")] = "false",
    as_json: AsJson = False,
) -> None:
    """Create or update a subscription group on a broker (-b) or every master of a cluster (-c)."""
    from broker.remoting.protocol.body import SubscriptionGroupConfig

    one_target(cluster, broker_addr)
    cfg = SubscriptionGroupConfig(
        group_name=group, consume_enable=_java_bool(consume_enable),
        consume_from_min_enable=_java_bool(consume_from_min_enable),
        consume_broadcast_enable=_java_bool(consume_broadcast_enable), retry_queue_nums=retry_queue_nums,
        retry_max_times=retry_max_times, broker_id=broker_id, which_broker_when_consume_slowly=slowly_broker_id,
        notify_consumer_ids_changed_enable=_java_bool(notify),
        # RocketMQ 5's field: kept as the extra key 4.9's model lacks (the pop service reads it)
        consumeMessageOrderly=_java_bool(orderly),
    )  # fmt: skip
    addrs = _ops(namesrv, lambda a: a.update_sub_group(cfg, cluster=cluster, broker_addr=broker_addr))
    done(as_json, {"config": cfg.to_json(), "brokers": addrs},
         [f"create subscription group to {a} success." for a in addrs] + [str(cfg.to_json())])  # fmt: skip


@admin_app.command("deleteSubGroup")
def delete_sub_group(
    group: Annotated[str, typer.Option("-g", "--groupName")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    cluster: Cluster = None,
    broker_addr: BrokerAddr = None,
    remove_offset: Annotated[bool, typer.Option("-r", "--removeOffset", help="Also drop its offsets.")] = False,
    as_json: AsJson = False,
) -> None:
    """Delete a subscription group (in a cluster also its %RETRY% and %DLQ% topics)."""
    one_target(cluster, broker_addr)
    addrs = _ops(namesrv, lambda a: a.delete_sub_group(group, cluster=cluster, broker_addr=broker_addr,
                                                       remove_offset=remove_offset))  # fmt: skip
    done(as_json, {"group": group, "brokers": addrs},
         [f"delete subscription group [{group}] from broker [{a}] success." for a in addrs])  # fmt: skip


@admin_app.command("resetOffsetByTime")
def reset_offset_by_time(
    group: Annotated[str, typer.Option("-g", "--group")],
    topic: Annotated[str, typer.Option("-t", "--topic")],
    timestamp: Annotated[str, typer.Option("-s", "--timestamp", help="now, ms, or yyyy-MM-dd#HH:mm:ss:SSS")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    force: Annotated[str, typer.Option("-f", "--force", help="true: also move forward in time.")] = "true",
    as_json: AsJson = False,
) -> None:
    """Reset a group's offsets on a topic to a time (online consumers are told the new offsets)."""
    ts = parse_timestamp(timestamp)
    table_ = _ops(namesrv, lambda a: a.reset_offset_by_time(topic, group, ts, _java_bool(force)))
    rows = [{"brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off} for mq, off in table_.items()]
    if as_json:
        _print_json({"group": group, "topic": topic, "timestamp": ts, "offsets": rows})
        return
    t = table("#brokerName", "#queueId", "#offset")
    for r in rows:
        t.add_row(r["brokerName"], str(r["queueId"]), str(r["offset"]))
    console().print(t)


@admin_app.command("cloneGroupOffset")
def clone_group_offset(
    src: Annotated[str, typer.Option("-s", "--srcGroup")],
    dest: Annotated[str, typer.Option("-d", "--destGroup")],
    topic: Annotated[str, typer.Option("-t", "--topic")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    offline: Annotated[bool, typer.Option("-o", "--offline")] = False,
    as_json: AsJson = False,
) -> None:
    """Give a group another group's offsets on a topic."""
    addrs = _ops(namesrv, lambda a: a.clone_group_offset(src, dest, topic, offline))
    done(as_json, {"srcGroup": src, "destGroup": dest, "topic": topic, "brokers": addrs},
         [f"clone group offset success. srcGroup[{src}], destGroup={dest}, topic[{topic}]"])  # fmt: skip


@admin_app.command("consumerConnection")
def consumer_connection(
    group: Annotated[str, typer.Option("-g", "--consumerGroup")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    as_json: AsJson = False,
) -> None:
    """The clients of a consumer group and what they subscribe to."""
    cc = _ops(namesrv, lambda a: a.consumer_connection(group))
    if as_json:
        _print_json(cc.to_json())
        return
    t = table("#ClientId", "#ClientAddr", "#Language", "#Version")
    for c in cc.connection_set:
        t.add_row(c.client_id, c.client_addr, c.language, str(c.version))
    console().print(t)
    s = table("#Topic", "#SubExpression")
    for topic, sub in cc.subscription_table.items():
        s.add_row(topic, sub.sub_string)
    console().print(s)
    console().print(f"ConsumeType: {cc.consume_type}\nMessageModel: {cc.message_model}\n"
                    f"ConsumeFromWhere: {cc.consume_from_where}", markup=False)  # fmt: skip


@admin_app.command("producerConnection")
def producer_connection(
    group: Annotated[str, typer.Option("-g", "--producerGroup")],
    topic: Annotated[str, typer.Option("-t", "--topic")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    as_json: AsJson = False,
) -> None:
    """The clients of a producer group (seen by the brokers of a topic)."""
    pc = _ops(namesrv, lambda a: a.producer_connection(group, topic))
    if as_json:
        _print_json(pc.to_json())
        return
    t = table("#ClientId", "#ClientAddr", "#Language", "#Version")
    for c in pc.connection_set:
        t.add_row(c.client_id, c.client_addr, c.language, str(c.version))
    console().print(t)


@admin_app.command("consumerStatus")
def consumer_status(
    group: Annotated[str, typer.Option("-g", "--consumerGroup")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    client_id: Annotated[str | None, typer.Option("-i", "--clientId")] = None,
    as_json: AsJson = False,
) -> None:
    """Each client's own view of its consumption (GET_CONSUMER_RUNNING_INFO)."""
    from broker.client.ops import running_info_json

    infos = _ops(namesrv, lambda a: a.consumer_status(group, client_id))
    data = {cid: running_info_json(info) for cid, info in infos.items()}
    if as_json:
        _print_json(data)
        return
    t = table("#ClientId", "#Subscriptions", "#Queues", "#Properties")
    for cid, info in infos.items():
        t.add_row(cid, str(len(info.subscription_set)), str(len(info.mq_table)),
                  ", ".join(f"{k}={v}" for k, v in sorted(info.properties.items()))[:200])  # fmt: skip
    console().print(t)


@admin_app.command("queryMsgByOffset")
def query_msg_by_offset(
    topic: Annotated[str, typer.Option("-t", "--topic")],
    broker_name: Annotated[str, typer.Option("-b", "--brokerName")],
    queue_id: Annotated[int, typer.Option("-i", "--queueId")],
    offset: Annotated[int, typer.Option("-o", "--offset")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    as_json: AsJson = False,
) -> None:
    """The message at a queue offset."""
    m = _ops(namesrv, lambda a: a.query_msg_by_offset(topic, broker_name, queue_id, offset))
    if as_json:
        _print_json(m.to_json())
    else:
        console().print(message_detail_table(m))


@admin_app.command("topicRoute")
def topic_route(
    topic: Annotated[str, typer.Option("-t", "--topic")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    as_json: AsJson = False,
) -> None:
    """The NameServer's route of a topic (JSON, as mqadmin prints it)."""
    route = _ops(namesrv, lambda a: a.topic_route(topic))
    if route is None:
        print_error(f"no route for topic {topic}")
        raise typer.Exit(1)
    _print_json(json.loads(route.encode()))


@admin_app.command("brokerStatus")
def broker_status(
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    broker_addr: BrokerAddr = None,
    cluster: Cluster = None,
    as_json: AsJson = False,
) -> None:
    """A broker's runtime figures (GET_BROKER_RUNTIME_INFO): TPS, today's and yesterday's counts, store state."""
    one_target(cluster, broker_addr)

    async def go(a: OpsAdmin) -> dict[str, dict[str, str]]:
        addrs = [broker_addr] if broker_addr else await a.master_addrs(cluster or "")
        return {addr: await a.broker_runtime_info(addr) for addr in addrs}

    infos = _ops(namesrv, go)
    if as_json:
        _print_json(infos if cluster else infos[broker_addr or ""])
        return
    for addr, info in infos.items():
        for k, v in sorted(info.items()):
            console().print(f"{addr:<24} {k:<40}: {v}" if cluster else f"{k:<40}: {v}", markup=False, highlight=False)


@admin_app.command("getBrokerConfig")
def get_broker_config(
    broker_addr: Annotated[str, typer.Option("-b", "--brokerAddr")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    as_json: AsJson = False,
) -> None:
    """Every setting of a broker."""
    cfg = _ops(namesrv, lambda a: a.get_broker_config(broker_addr))
    done(as_json, cfg, [f"{k:<40} = {v}" for k, v in cfg.items()])


@admin_app.command("updateBrokerConfig")
def update_broker_config(
    key: Annotated[str, typer.Option("-k", "--key")],
    value: Annotated[str, typer.Option("-v", "--value")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    broker_addr: BrokerAddr = None,
    cluster: Cluster = None,
    as_json: AsJson = False,
) -> None:
    """Change a setting while the broker runs (only the keys it applies at once)."""
    one_target(cluster, broker_addr)
    addrs = _ops(namesrv, lambda a: a.update_broker_config(key, value, cluster=cluster, broker_addr=broker_addr))
    done(as_json, {"key": key, "value": value, "brokers": addrs},
         [f"update broker config success, {a}" for a in addrs])  # fmt: skip


@admin_app.command("wipeWritePerm")
def wipe_write_perm(
    broker_name: Annotated[str, typer.Option("-b", "--brokerName")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    as_json: AsJson = False,
) -> None:
    """Stop clients sending to a broker (in the NameServers' routes)."""
    counts = _ops(namesrv, lambda a: a.wipe_write_perm(broker_name))
    done(
        as_json,
        counts,
        [f"wipe write perm of broker[{broker_name}] in name server[{ns}] OK, {n}" for ns, n in counts.items()],
    )


@admin_app.command("addWritePerm")
def add_write_perm(
    broker_name: Annotated[str, typer.Option("-b", "--brokerName")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    as_json: AsJson = False,
) -> None:
    """Let clients send to a broker again."""
    counts = _ops(namesrv, lambda a: a.add_write_perm(broker_name))
    done(
        as_json,
        counts,
        [f"add write perm of broker[{broker_name}] in name server[{ns}] OK, {n}" for ns, n in counts.items()],
    )


@admin_app.command("deleteExpiredCommitLog")
def delete_expired_commitlog(
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    broker_addr: BrokerAddr = None,
    cluster: Cluster = None,
    as_json: AsJson = False,
) -> None:
    """Run the expired-CommitLog pass now (segments are tiered first, per expiredSegmentPolicy)."""
    one_target(cluster, broker_addr)
    addrs = _ops(namesrv, lambda a: a.delete_expired_commitlog(cluster=cluster, broker_addr=broker_addr))
    done(as_json, {"brokers": addrs}, [f"delete expired commitlog on {a} success" for a in addrs])


@admin_app.command("statsAll")
def stats_all(
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    topic: Annotated[str | None, typer.Option("-t", "--topic")] = None,
    active: Annotated[bool, typer.Option("-a", "--activeTopic", help="Only topics with traffic.")] = False,
    as_json: AsJson = False,
) -> None:
    """Per topic and group: lag, in/out TPS over the last minute, messages in the last 24 h."""
    rows = _ops(namesrv, lambda a: a.stats_all(topic, active))
    if as_json:
        _print_json([r.to_json() for r in rows])
        return
    t = table("#Topic", "#Consumer Group", "#Accumulation", "#InTPS", "#OutTPS", "#InMsg24Hour", "#OutMsg24Hour")
    for r in rows:
        t.add_row(r.topic, r.group, str(r.accumulation), f"{r.in_tps:.2f}", f"{r.out_tps:.2f}" if r.group else "",
                  str(r.in_msg_24h), str(r.out_msg_24h) if r.group else "NO_CONSUMER")  # fmt: skip
    console().print(t)
