"""``mqlake admin``: mqadmin's everyday commands, with its camelCase names and short options.

Every command takes ``-n/--namesrv`` (default ``$NAMESRV_ADDR``, else 127.0.0.1:9876, ``;``-separated for
several) and ``--json`` (one JSON document on stdout instead of a table).  Errors go to stderr with exit code 1.

Before the command: ``--access-key``/``--secret-key`` (or ``$MQLAKE_ACCESS_KEY``/``$MQLAKE_SECRET_KEY``) sign
every request as RocketMQ's ``AclClientRPCHook`` does, for a broker with ``aclEnable=true``; ``--tls`` (or
``$MQLAKE_TLS=true``) connects with TLS, ``--tls-trust FILE`` also checks the servers' certificates against it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.table import Table

from cli.messages import body_text
from store.console import console, print_error, table, time_text
from store.constants import DEFAULT_NAMESRV_ADDR, RETRY_GROUP_TOPIC_PREFIX

if TYPE_CHECKING:  # the client is imported when a command runs: `mqlake up` need not pay for it
    from broker.client.admin import Admin, BrokerInfo, QueueProgress, QueueStatus
    from broker.client.message import MessageExt

admin_app = typer.Typer(
    help="Administer topics, messages, consumers and clusters (mqadmin's commands).", no_args_is_help=True
)


@dataclass
class _Connection:
    """How every command of this run reaches the servers (set by the group's options)."""

    access_key: str | None = None
    secret_key: str | None = None
    tls: bool = False
    tls_trust: Path | None = None


_conn = _Connection()


@admin_app.callback()
def _options(
    access_key: Annotated[str | None, typer.Option("--access-key", envvar="MQLAKE_ACCESS_KEY",
                                                  help="Sign requests with this ACL access key.")] = None,
    secret_key: Annotated[str | None, typer.Option("--secret-key", envvar="MQLAKE_SECRET_KEY", show_envvar=True,
                                                  help="Its secret (prefer the environment variable).")] = None,
    tls: Annotated[bool, typer.Option("--tls", envvar="MQLAKE_TLS", help="Connect with TLS.")] = False,
    tls_trust: Annotated[Path | None, typer.Option("--tls-trust", help="Check servers' certificates against this "
                                                   "CA file (implies --tls).")] = None,
) -> None:
    if (access_key is None) != (secret_key is None):
        print_error("give both --access-key and --secret-key (or MQLAKE_ACCESS_KEY and MQLAKE_SECRET_KEY), or neither")
        raise typer.Exit(2)
    _conn.access_key, _conn.secret_key, _conn.tls, _conn.tls_trust = access_key, secret_key, tls, tls_trust


T = TypeVar("T")

Namesrv = Annotated[
    str, typer.Option("-n", "--namesrv", envvar="NAMESRV_ADDR", help="NameServer address(es), ';'-separated.")
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


A = TypeVar("A", bound="Admin")


def _call(namesrv: str, fn: Callable[[A], Awaitable[T]], client: type[A] | None = None) -> T:
    """Run ``fn`` with a connected ``client`` (``Admin`` unless given) that signs and speaks TLS as the
    command line asked; a client or wire error ends the command with exit code 1."""
    from broker.client.admin import Admin
    from broker.remoting.loop import run
    from store.errors import MQLakeError

    async def go() -> T:
        from broker.remoting.signing import Credentials
        from broker.remoting.tls import client_context

        creds = None
        if _conn.access_key is not None and _conn.secret_key is not None:
            creds = Credentials(_conn.access_key, _conn.secret_key)
        ssl_context = None
        if _conn.tls or _conn.tls_trust is not None:
            ssl_context = client_context(trust=_conn.tls_trust, verify_server=_conn.tls_trust is not None)
        async with (client or Admin)(namesrv, credentials=creds, ssl_context=ssl_context) as admin:
            return await fn(admin)  # type: ignore[arg-type]

    try:
        return run(go())
    # the client's and the wire's errors, and a reply that does not parse (RecordError, RouteError, HeaderError, ...)
    except MQLakeError as e:
        print_error(e)
        raise typer.Exit(1) from None


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


# -- renderers (pure: rows in, rich Table out) ------------------------------------------------------------------


def topic_status_table(rows: list[QueueStatus]) -> Table:
    t = table("#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated")
    for r in rows:
        t.add_row(r.broker_name, str(r.queue_id), str(r.min_offset), str(r.max_offset),
                  time_text(r.last_update_timestamp))
    return t


def messages_table(msgs: list[MessageExt]) -> Table:
    t = table("#Message ID", "#Offset Msg ID", "#QID", "#Offset", "#Tags", "#Keys", "#Store Time", "#Body")
    for m in msgs:
        body = body_text(m.body)
        t.add_row(m.msg_id, m.offset_msg_id, str(m.queue_id), str(m.queue_offset), m.tags or "", m.keys or "",
                  time_text(m.store_timestamp), body)  # fmt: skip
    return t


def message_detail_table(m: MessageExt) -> Table:
    t = table("Field", "Value", show_header=False)
    for k, v in m.to_json().items():
        if k in ("bornTimestamp", "storeTimestamp") and isinstance(v, int):
            v = f"{time_text(v)} ({v})"  # readable, with the epoch ms mqadmin's Java API hands out
        t.add_row(k, json.dumps(v, ensure_ascii=False) if isinstance(v, dict) else str(v))
    return t


def consumer_progress_table(rows: list[QueueProgress]) -> Table:
    t = table("#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff", "#LastTime")
    for r in rows:
        t.add_row(r.topic, r.broker_name, str(r.queue_id), str(r.broker_offset), str(r.consumer_offset), str(r.lag),
                  time_text(r.last_timestamp))  # fmt: skip
    t.caption = f"Diff Total: {sum(r.lag for r in rows)}"
    return t


def _tps(runtime: dict[str, str], key: str) -> float:
    """The 10 s rate of a ``putTps``-style value ("10s 60s 600s")."""
    try:
        return float(runtime.get(key, "0").split(" ")[0])
    except ValueError:
        return 0.0


def cluster_table(rows: list[BrokerInfo], now_ms: int | None = None) -> Table:
    """mqadmin clusterList's columns and formats: ``%9.2f(queue size,head wait ms)`` TPS, the page cache lock
    wait, the hours of history in the CommitLog (``%2.2f``) and the disk ratio (``%.4f``)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    t = table("#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#InTPS(LOAD)", "#OutTPS(LOAD)",
              "#PCWait(ms)", "#Hour", "#SPACE")  # fmt: skip
    for r in rows:
        rt = r.runtime
        earliest = int(rt.get("earliestMessageTimeStamp", "0") or 0)
        hours = (now_ms - earliest) / 1000 / 60 / 60 if earliest > 0 else 0.0
        in_tps = (f"{_tps(rt, 'putTps'):9.2f}({rt.get('sendThreadPoolQueueSize', '0')},"
                  f"{rt.get('sendThreadPoolQueueHeadWaitTimeMills', '0')}ms)")  # fmt: skip
        out_tps = (f"{_tps(rt, 'getTransferedTps'):9.2f}({rt.get('pullThreadPoolQueueSize', '0')},"
                   f"{rt.get('pullThreadPoolQueueHeadWaitTimeMills', '0')}ms)")  # fmt: skip
        space = f"{float(rt.get('commitLogDiskRatio', '0') or 0):.4f}"
        t.add_row(r.cluster, r.broker_name, str(r.broker_id), r.addr, rt.get("brokerVersionDesc", "-"), in_tps,
                  out_tps, rt.get("pageCacheLockTimeMills", "0"), f"{hours:2.2f}", space)  # fmt: skip
    return t


def groups_table(rows: list[dict[str, Any]]) -> Table:
    """consumerProgress without -g: one row per consumer group, as mqadmin prints them."""
    t = table("#Group", "#Count", "#Version", "#Type", "#Model", "#TPS", "#Diff Total")
    for g in rows:
        t.add_row(g["group"], str(g["count"]), g["version"], g["type"], g["model"], str(g["tps"]), str(g["diffTotal"]))
    return t


# -- commands ------------------------------------------------------------------------------------------------


@admin_app.command("updateTopic")
def update_topic(
    topic: Annotated[str, typer.Option("-t", "--topic", help="Topic name.")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    cluster: Annotated[str | None, typer.Option("-c", "--clusterName", help="Create on every master of it.")] = None,
    broker_addr: Annotated[str | None, typer.Option("-b", "--brokerAddr", help="Create on this broker.")] = None,
    read_queue_nums: Annotated[int, typer.Option("-r", "--readQueueNums", min=1)] = 8,
    write_queue_nums: Annotated[int, typer.Option("-w", "--writeQueueNums", min=1)] = 8,
    perm: Annotated[int, typer.Option("-p", "--perm", help="2 write, 4 read, 6 read+write.")] = 6,
    order: Annotated[bool, typer.Option("-o", "--order")] = False,
    attributes: Annotated[str | None, typer.Option(
        "-a", "--attributes", help="RocketMQ 5 topic attributes: +message.type=NORMAL|FIFO|DELAY|TRANSACTION, "
                                   "-key deletes one (docs/grpc.md).")] = None,
    as_json: AsJson = False,
) -> None:
    """Create or update a topic on a broker (-b) or on every broker of a cluster (-c)."""
    one_target(cluster, broker_addr)
    change = attributes.strip() if attributes else None
    addrs = _call(namesrv, lambda a: a.create_topic(
        topic, cluster=cluster, broker_addr=broker_addr, read_queue_nums=read_queue_nums,
        write_queue_nums=write_queue_nums, perm=perm, order=order, attributes=change,
    ))  # fmt: skip
    result = {"topic": topic, "readQueueNums": read_queue_nums, "writeQueueNums": write_queue_nums, "perm": perm,
              "brokers": addrs}  # fmt: skip
    if change:
        result["attributes"] = change
    if as_json:
        _print_json(result)
    else:
        for addr in addrs:
            console().print(f"create topic to {addr} success.")
        shown = f", attributes={change}" if change else ""
        console().print(f"TopicConfig [topicName={topic}, readQueueNums={read_queue_nums}, "
                        f"writeQueueNums={write_queue_nums}, perm={perm}{shown}]")  # fmt: skip


@admin_app.command("topicList")
def topic_list(namesrv: Namesrv = DEFAULT_NAMESRV_ADDR, as_json: AsJson = False) -> None:
    """Every topic the NameServer knows."""
    topics = _call(namesrv, lambda a: a.topic_list())
    if as_json:
        _print_json(topics)
    else:
        for t in topics:
            console().print(t, markup=False, highlight=False)


@admin_app.command("topicStatus")
def topic_status(
    topic: Annotated[str, typer.Option("-t", "--topic")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    as_json: AsJson = False,
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
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
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
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
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
    group: Annotated[str | None, typer.Option("-g", "--groupName", help="This group (default: every group).")] = None,
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    topic: Annotated[str | None, typer.Option("-t", "--topicName")] = None,
    as_json: AsJson = False,
) -> None:
    """Per queue broker offset, consumer offset and lag of a consumer group; without -g, every group's total."""
    if group is None:
        from broker.client.ops import OpsAdmin

        groups = _call(namesrv, _all_groups_progress, OpsAdmin)
        if as_json:
            _print_json(groups)
        else:
            console().print(groups_table(groups))
        return
    rows = _call(namesrv, lambda a: a.consumer_progress(group, topic))
    if as_json:
        _print_json({"group": group, "diffTotal": sum(r.lag for r in rows), "queues": [r.to_json() for r in rows]})
    else:
        console().print(consumer_progress_table(rows))


async def _all_groups_progress(a: Admin) -> list[dict[str, Any]]:
    """Every group that has a retry topic (how mqadmin finds them), its connections and its lag."""
    from broker.client.errors import MQBrokerError, MQClientError
    from broker.client.ops import OpsAdmin
    from broker.remoting.codes import CURRENT_VERSION
    from broker.server.admin import BROKER_VERSION_DESC

    assert isinstance(a, OpsAdmin)
    out = []
    for retry_topic in sorted(t for t in await a.topic_list() if t.startswith(RETRY_GROUP_TOPIC_PREFIX)):
        group = retry_topic[len(RETRY_GROUP_TOPIC_PREFIX):]
        queues, tps = await a.consume_stats(group)
        diff = sum(r.lag for r in queues)
        try:
            conn = await a.consumer_connection(group)
        except (MQBrokerError, MQClientError):  # no client online: mqadmin prints it OFFLINE
            out.append({"group": group, "count": 0, "version": "OFFLINE", "type": "", "model": "", "tps": int(tps),
                        "diffTotal": diff})  # fmt: skip
            continue
        versions = [c.version for c in conn.connection_set]
        low = min(versions) if versions else 0
        out.append({"group": group, "count": len(conn.connection_set),
                    "version": BROKER_VERSION_DESC if low == CURRENT_VERSION else str(low),
                    "type": conn.consume_type or "", "model": conn.message_model or "", "tps": int(tps),
                    "diffTotal": diff})  # fmt: skip
    return out


@admin_app.command("clusterList")
def cluster_list(namesrv: Namesrv = DEFAULT_NAMESRV_ADDR, as_json: AsJson = False) -> None:
    """Brokers per cluster with their runtime figures."""
    rows = _call(namesrv, lambda a: a.cluster_list())
    if as_json:
        _print_json([{"cluster": r.cluster, "brokerName": r.broker_name, "brokerId": r.broker_id, "addr": r.addr,
                      "runtime": r.runtime} for r in rows])  # fmt: skip
    else:
        console().print(cluster_table(rows))


# -- plain ACL ----------------------------------------------------------------------------------------------------

BrokerAddr = Annotated[str | None, typer.Option("-b", "--brokerAddr", help="This broker.")]
Cluster = Annotated[str | None, typer.Option("-c", "--clusterName", help="Every master of this cluster.")]


def _split(text: str | None) -> tuple[str, ...]:
    from broker.acl.addresses import split_list

    return tuple(split_list(text))


def one_target(cluster: str | None, broker_addr: str | None) -> None:
    if (cluster is None) == (broker_addr is None):
        print_error("give exactly one of -c/--clusterName or -b/--brokerAddr")
        raise typer.Exit(2)


def _acl_call(
    namesrv: str, broker_addr: str | None, cluster: str | None, fn: Callable[[Admin, list[str]], Awaitable[T]]
) -> T:
    one_target(cluster, broker_addr)

    async def go(admin: Admin) -> T:
        return await fn(admin, await admin.target_brokers(cluster, broker_addr))

    return _call(namesrv, go)


@admin_app.command("updateAclConfig")
def update_acl_config(
    access_key: Annotated[str, typer.Option("-a", "--accessKey", help="The account's access key.")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    broker_addr: BrokerAddr = None,
    cluster: Cluster = None,
    secret_key: Annotated[str | None, typer.Option(
        "-s", "--secretKey", envvar="MQLAKE_ACL_SECRET_KEY",
        help="Its secret (kept when an account is updated without one).")] = None,
    white: Annotated[str | None, typer.Option("-w", "--whiteRemoteAddress")] = None,
    default_topic_perm: Annotated[str | None, typer.Option("-i", "--defaultTopicPerm", help="DENY, PUB, SUB or PUB|SUB")
                                  ] = None,
    default_group_perm: Annotated[str | None, typer.Option("-u", "--defaultGroupPerm")] = None,
    topic_perms: Annotated[str | None, typer.Option("-t", "--topicPerms", help="e.g. topicA=DENY,topicB=SUB")] = None,
    group_perms: Annotated[str | None, typer.Option("-g", "--groupPerms", help="e.g. groupA=DENY,groupB=SUB")] = None,
    admin_flag: Annotated[bool, typer.Option("-m", "--admin", help="The account may use the admin codes.")] = False,
    as_json: AsJson = False,
) -> None:
    """Create or update an account of plain_acl.yml on a broker (-b) or every broker of a cluster (-c)."""
    from broker.client.acl_admin import AclAccount, update_account

    account = AclAccount(access_key, secret_key, white, admin_flag, default_topic_perm, default_group_perm,
                         _split(topic_perms), _split(group_perms))  # fmt: skip
    addrs = _acl_call(namesrv, broker_addr, cluster, lambda a, addrs: update_account(a, addrs, account))
    done(as_json, {"accessKey": access_key, "brokers": addrs},
          [f"update plain access config to {a} success." for a in addrs])  # fmt: skip


@admin_app.command("deleteAclConfig")
def delete_acl_config(
    access_key: Annotated[str, typer.Option("-a", "--accessKey")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    broker_addr: BrokerAddr = None,
    cluster: Cluster = None,
    as_json: AsJson = False,
) -> None:
    """Delete an account of plain_acl.yml."""
    from broker.client.acl_admin import delete_account

    addrs = _acl_call(namesrv, broker_addr, cluster, lambda a, addrs: delete_account(a, addrs, access_key))
    done(as_json, {"accessKey": access_key, "brokers": addrs},
          [f"delete plain access config account from {a} success." for a in addrs])  # fmt: skip


@admin_app.command("updateGlobalWhiteAddr")
def update_global_white_addr(
    addresses: Annotated[str, typer.Option("-g", "--globalWhiteRemoteAddresses",
                                           help="e.g. 10.10.103.*,192.168.0.*")],
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    broker_addr: BrokerAddr = None,
    cluster: Cluster = None,
    as_json: AsJson = False,
) -> None:
    """Replace globalWhiteRemoteAddresses of plain_acl.yml."""
    from broker.client.acl_admin import update_global_white_addrs

    patterns = list(_split(addresses))
    addrs = _acl_call(namesrv, broker_addr, cluster, lambda a, addrs: update_global_white_addrs(a, addrs, patterns))
    done(as_json, {"globalWhiteRemoteAddresses": patterns, "brokers": addrs},
          [f"update global white remote addresses to {a} success." for a in addrs])  # fmt: skip


@admin_app.command("getAclConfig")
def get_acl_config(
    namesrv: Namesrv = DEFAULT_NAMESRV_ADDR,
    broker_addr: BrokerAddr = None,
    cluster: Cluster = None,
    as_json: AsJson = False,
) -> None:
    """The accounts (secrets masked) and global white addresses of each broker."""
    from broker.client.acl_admin import acl_config

    async def fetch(admin: Admin, addrs: list[str]) -> list[dict[str, Any]]:
        return [await acl_config(admin, addr) for addr in addrs]

    configs = _acl_call(namesrv, broker_addr, cluster, fetch)
    if as_json:
        _print_json(configs)
        return
    for conf in configs:
        console().print(f"{conf['brokerName']} {conf['brokerAddr']} version {conf['version']}", markup=False)
        t = table("#accessKey", "#admin", "#whiteRemoteAddress", "#defaultTopicPerm", "#defaultGroupPerm",
                  "#topicPerms", "#groupPerms")  # fmt: skip
        for a in conf.get("plainAccessConfigs", []):
            t.add_row(a.get("accessKey", ""), str(a.get("admin", False)).lower(), a.get("whiteRemoteAddress") or "",
                      a.get("defaultTopicPerm") or "", a.get("defaultGroupPerm") or "",
                      ",".join(a.get("topicPerms", [])), ",".join(a.get("groupPerms", [])))  # fmt: skip
        console().print(t)
        console().print("globalWhiteRemoteAddresses: " + ",".join(conf.get("globalWhiteAddrs", [])), markup=False)


def done(as_json: bool, result: Any, lines: list[str]) -> None:
    if as_json:
        _print_json(result)
    else:
        for line in lines:
            console().print(line, markup=False, highlight=False)
