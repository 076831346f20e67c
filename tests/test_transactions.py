"""Transactional messages against a real ``mqlake up`` with the Python TransactionProducer: half messages are
invisible until committed, rollback delivers nothing, UNKNOW is resolved by the broker's check-back, a message
checked ``transactionCheckMax`` times moves to TRANS_CHECK_MAX_TIME_TOPIC, CHECK_IMMUNITY_TIME_IN_SECONDS holds
the check back, stale or bogus END_TRANSACTIONs deliver nothing twice, and a half message survives SIGKILL and is
resolved by a check-back after the restart."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from broker.client import LocalTransactionState, Message, MessageExt, Producer, PullConsumer, PullStatus
from broker.client.transaction_producer import TransactionProducer
from broker.remoting import headers as h
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.remoting.loop import run
from store.format import msgid, records
from tests.aio import poll
from tests.test_client_broker import make_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

until = functools.partial(poll, timeout=30.0, interval=0.05)
COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)  # fmt: skip
# Check rounds every 200 ms, for half messages older than 300 ms: the tests see several rounds per second.
FAST_CHECKS = {"transactionTimeOut": "300", "transactionCheckInterval": "200", "transactionCheckMax": "3"}
HALF, OP, CHECK_MAX = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"


async def read_topic(c: PullConsumer, topic: str, queues: int = 1) -> list[MessageExt]:
    """Every message of ``topic`` (queues 0..queues-1) in queue order; [] while the topic does not exist."""
    out: list[MessageExt] = []
    for q in range(queues):
        mq = next((m for m in await _queues(c, topic) if m.queue_id == q), None)
        if mq is None:
            continue
        offset = 0
        while True:
            r = await c.pull(mq, offset, 32)
            if r.status is not PullStatus.FOUND:
                break
            out += r.messages
            offset = r.next_begin_offset
    return out


async def _queues(c: PullConsumer, topic: str) -> list:
    try:
        return await c.fetch_queues(topic)
    except Exception:  # no route yet
        return []


class Checks:
    """A check listener answering per message key, and counting the check-backs it got."""

    def __init__(self, answers: dict[str, LocalTransactionState] | None = None) -> None:
        self.answers = answers or {}
        self.seen: Counter[str] = Counter()
        self.messages: list[MessageExt] = []

    def __call__(self, msg: MessageExt) -> LocalTransactionState:
        self.seen[msg.keys] += 1
        self.messages.append(msg)
        return self.answers.get(msg.keys, UNKNOW)


def test_commit_and_rollback_and_the_records_they_leave(mqlake_server_factory):
    server = mqlake_server_factory(**FAST_CHECKS)
    ns, topic = server.namesrv_addr, "tx_commit"

    async def go():
        await make_topic(server, topic, queues=1)
        async with TransactionProducer("pg_tx_commit", ns, Checks()) as p, PullConsumer("cg_tx_commit", ns) as c:
            invisible = []

            async def local(msg: Message, sent) -> LocalTransactionState:
                # the half message is stored (and dispatched to the half topic), the real topic does not have it
                await until(lambda: _count(c, HALF, sent.queue_offset + 1), what="half message dispatched")
                invisible.append(msg.keys not in [m.keys for m in await read_topic(c, topic)])
                return COMMIT if msg.keys != "rb" else ROLLBACK

            results = [await p.send_in_transaction(Message(topic, f"body-{k}", tags="T", keys=k), local)
                       for k in ("c1", "rb", "c2")]  # fmt: skip
            assert [r.local_state for r in results] == [COMMIT, ROLLBACK, COMMIT]
            assert invisible == [True, True, True]
            await until(lambda: _count(c, topic, 2), what="2 committed messages")
            await until(lambda: _op_offsets_at_least(c, 3), what="3 half offsets removed by op messages")
            got = await read_topic(c, topic)
            assert [(m.keys, m.body) for m in got] == [("c1", b"body-c1"), ("c2", b"body-c2")]
            halves = await read_topic(c, HALF)
            assert [m.keys for m in halves] == ["c1", "rb", "c2"]
            for m, half in zip(got, (halves[0], halves[2]), strict=True):
                assert m.sys_flag & records.TRANSACTION_ROLLBACK_TYPE == records.TRANSACTION_COMMIT_TYPE
                assert m.prepared_transaction_offset == half.commit_log_offset
                assert m.msg_id == half.msg_id  # the producer's UNIQ_KEY, its transaction id
            for half, r in zip(halves, results, strict=True):
                assert half.properties["REAL_TOPIC"] == topic and half.properties["REAL_QID"] == "0"
                assert half.properties["TRAN_MSG"] == "true" and half.properties["PGROUP"] == "pg_tx_commit"
                assert half.properties["__transactionId__"] == r.send_result.msg_id
                assert half.sys_flag & records.TRANSACTION_ROLLBACK_TYPE == records.TRANSACTION_NOT_TYPE
                assert half.queue_offset == r.send_result.queue_offset
            ops = await read_topic(c, OP)
            assert await _op_offsets(c) == [0, 1, 2] and {m.tags for m in ops} == {"d"}

    run(go())


async def _op_offsets(c: PullConsumer) -> list[int]:
    """The half queue offsets the op messages remove (one per op, or several joined by "," as 5.x batches them)."""
    return sorted(int(o) for m in await read_topic(c, OP) for o in m.body.decode().split(","))


async def _op_offsets_at_least(c: PullConsumer, n: int) -> bool:
    return len(await _op_offsets(c)) >= n


async def _count(c: PullConsumer, topic: str, at_least: int) -> bool:
    return len(await read_topic(c, topic)) >= at_least


def test_unknown_is_resolved_by_check_back_and_stale_or_bogus_end_transactions_deliver_nothing_twice(
    mqlake_server_factory,
):
    server = mqlake_server_factory(**FAST_CHECKS)
    ns, topic = server.namesrv_addr, "tx_check"

    async def go():
        await make_topic(server, topic, queues=1)
        checks = Checks({"k1": COMMIT, "k2": ROLLBACK, "barrier": COMMIT})
        async with TransactionProducer("pg_tx_check", ns, checks, heartbeat_interval=0.5) as p, \
                PullConsumer("cg_tx_check", ns) as c:  # fmt: skip
            r1 = await p.send_in_transaction(Message(topic, "one", keys="k1"), lambda m, r: UNKNOW)
            await p.send_in_transaction(Message(topic, "two", keys="k2"), lambda m, r: UNKNOW)
            await until(lambda: _count(c, topic, 1), what="k1 committed by its check-back")
            await until(lambda: checks.seen["k2"] >= 1, what="k2 checked")
            checked = next(m for m in checks.messages if m.keys == "k1")
            assert checked.topic == topic and checked.queue_id == 0 and checked.body == b"one"

            # stale END_TRANSACTIONs for k1 (its original offsets, producer's and check's), one for an offset
            # that is no half message (k1's committed copy) and one for nowhere: all ignored
            committed = (await read_topic(c, topic))[0]
            _host, half_offset = msgid.decode_offset_msg_id(r1.send_result.offset_msg_id)
            sent = r1.send_result.queue_offset
            bogus = [(sent, half_offset, False), (sent, half_offset, True),
                     (committed.queue_offset, committed.commit_log_offset, False), (0, 987_654_321, True)]  # fmt: skip
            client = RemotingClient()
            try:
                for queue_offset, clog_offset, from_check in bogus:
                    header = h.EndTransactionRequestHeader(
                        producer_group="pg_tx_check", tran_state_table_offset=queue_offset,
                        commit_log_offset=clog_offset, commit_or_rollback=int(COMMIT),
                        from_transaction_check=from_check, msg_id="x",
                    )  # fmt: skip
                    cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, header, oneway=True)
                    await client.invoke_oneway(server.broker_addr, cmd)
            finally:
                await client.close()
            # a later transaction committed by check-back: once it is delivered, everything before was handled
            await p.send_in_transaction(Message(topic, "barrier", keys="barrier"), lambda m, r: UNKNOW)
            await until(lambda: _count(c, topic, 2), what="the barrier committed")
            assert [m.keys for m in await read_topic(c, topic)] == ["k1", "barrier"]  # k2 rolled back, k1 once
            assert "already resolved" in server.run_log() and "Find prepared transaction message failed" in (
                server.run_log()
            )

    run(go())


@pytest.mark.expected_errors("moved to TRANS_CHECK_MAX_TIME_TOPIC")
def test_check_max_moves_the_half_message_and_immunity_holds_its_check_back(mqlake_server_factory):
    server = mqlake_server_factory(**FAST_CHECKS)
    ns, topic = server.namesrv_addr, "tx_max"

    async def go():
        await make_topic(server, topic, queues=1)
        checks = Checks()  # always UNKNOW
        async with TransactionProducer("pg_tx_max", ns, checks) as p, PullConsumer("cg_tx_max", ns) as c:
            immune = Message(topic, "immune", keys="immune", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "3600"})
            await p.send_in_transaction(immune, lambda m, r: UNKNOW)
            await p.send_in_transaction(Message(topic, "never", keys="never"), lambda m, r: UNKNOW)
            await until(lambda: _count(c, CHECK_MAX, 1), what="the half message moved to TRANS_CHECK_MAX_TIME_TOPIC")
            moved = await read_topic(c, CHECK_MAX)
            assert [m.keys for m in moved] == ["never"] and moved[0].body == b"never"
            assert checks.seen["never"] == 3  # transactionCheckMax
            assert checks.seen["immune"] == 0  # an hour of immunity: it was passed over in every round
            assert await read_topic(c, topic) == []

    run(go())


def test_reject_transaction_message_refuses_half_messages(mqlake_server_factory):
    server = mqlake_server_factory(rejectTransactionMessage="true")

    async def go():
        await make_topic(server, "tx_reject", queues=1)
        async with TransactionProducer("pg_tx_reject", server.namesrv_addr, Checks()) as p:
            from broker.client import MQBrokerError

            with pytest.raises(MQBrokerError) as e:
                await p.send_in_transaction(Message("tx_reject", "x"), lambda m, r: COMMIT)
            assert e.value.code == 16  # NO_PERMISSION
        async with Producer("pg_tx_plain", server.namesrv_addr) as plain:  # the broker keeps serving
            await plain.send(Message("tx_reject", "plain"))

    run(go())


def test_half_message_survives_sigkill_and_check_back_resolves_it_after_restart(mqlake_server_factory):
    # SYNC_FLUSH: what the producer was told is on disk when the process dies (and END_TRANSACTION's waiting path)
    server = mqlake_server_factory(**FAST_CHECKS, flushDiskType="SYNC_FLUSH")
    ns, topic = server.namesrv_addr, "tx_crash"

    async def before(p: TransactionProducer, c: PullConsumer) -> None:
        await make_topic(server, topic, queues=1)
        await p.send_in_transaction(Message(topic, "done", keys="done"), lambda m, r: COMMIT)
        await p.send_in_transaction(Message(topic, "pending", keys="pending"), lambda m, r: UNKNOW)
        await until(lambda: _count(c, HALF, 2), what="both half messages dispatched")
        await until(lambda: _count(c, topic, 1), what="the committed one delivered")

    async def go():
        checks = Checks({"pending": COMMIT})
        checks_on = False

        def listener(msg: MessageExt) -> LocalTransactionState:
            # until the crash the producer does not know the outcome; afterwards it commits
            return checks(msg) if checks_on else UNKNOW

        async with TransactionProducer("pg_tx_crash", ns, listener, heartbeat_interval=0.3) as p:
            async with PullConsumer("cg_tx_crash", ns) as c:
                await before(p, c)
            server.kill()  # SIGKILL: no shutdown, no offsets or config flushed
            server.start()
            checks_on = True
            async with PullConsumer("cg_tx_crash2", ns) as c:
                await until(lambda: _count(c, topic, 2), what="the pending transaction committed after the restart")
                # a later transaction resolved by check-back proves later rounds ran: still nothing twice
                checks.answers["barrier"] = COMMIT
                await p.send_in_transaction(Message(topic, "barrier", keys="barrier"), lambda m, r: UNKNOW)
                await until(lambda: _count(c, topic, 3), what="the barrier committed")
                assert [m.keys for m in await read_topic(c, topic)] == ["done", "pending", "barrier"]

    run(go())


def test_a_late_commit_after_the_immunity_time_is_refused_and_left_to_the_check_back(mqlake_server_factory):
    """rejectCommitOrRollback: with CHECK_IMMUNITY_TIME_IN_SECONDS=1, a local transaction that ends only after the
    broker's first check-back (so after the immunity) has its COMMIT refused (ILLEGAL_OPERATION, unseen:
    END_TRANSACTION is oneway); the check-back's later answer, ROLLBACK, decides: nothing is delivered."""
    server = mqlake_server_factory(**FAST_CHECKS)
    ns, topic = server.namesrv_addr, "tx_late"

    async def go():
        await make_topic(server, topic, queues=1)
        checks = Checks()  # UNKNOW until the producer's own COMMIT has been sent
        async with TransactionProducer("pg_tx_late", ns, checks) as p, PullConsumer("cg_tx_late", ns) as c:
            async def slow_commit(msg: Message, sent) -> LocalTransactionState:
                await until(lambda: checks.seen["late"] >= 1, what="a check-back, so past the immunity")
                return COMMIT

            late = Message(topic, "late", keys="late", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "1"})
            r = await p.send_in_transaction(late, slow_commit)
            assert r.local_state is COMMIT
            await until(lambda: "after its check immunity" in server.run_log(), what="the late COMMIT refused")
            checks.answers["late"] = ROLLBACK
            await until(lambda: _op_offsets_at_least(c, 1), what="the check-back's rollback")
            assert await read_topic(c, topic) == []
            assert await read_topic(c, HALF)  # the half message is still there, resolved by the op

    run(go())
