"""``TransactionProducer`` (``TransactionMQProducer``): half message, local transaction, END_TRANSACTION, and
answers to the broker's CHECK_TRANSACTION_STATE.

``send_in_transaction`` sends the message as a half message (``TRAN_MSG=true``, ``PGROUP``, sysFlag PREPARED),
runs the local transaction and ends the transaction oneway with its outcome. A transaction left UNKNOW (or whose
END_TRANSACTION is lost) is asked about later by the broker: the check listener answers, and the producer sends
END_TRANSACTION with ``fromTransactionCheck=true``. The broker can ask only producers it knows, so this producer
heartbeats its group to every broker it sends to, at once and every ``heartbeat_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.client.errors import MQClientError
from broker.client.instance import check
from broker.client.message import Message, MessageExt, MessageQueue, SendResult, SendStatus, decode_messages
from broker.client.producer import Producer
from broker.remoting import headers as h
from broker.remoting.client import RemotingError
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel
from broker.remoting.protocol.heartbeat import HeartbeatData, ProducerData
from store.format import msgid, properties, records
from store.format.properties import PROPERTY_PRODUCER_GROUP

log = logging.getLogger(__name__)


class LocalTransactionState(enum.IntEnum):
    """The outcome of a local transaction, valued as END_TRANSACTION's ``commitOrRollback``."""

    COMMIT_MESSAGE = records.TRANSACTION_COMMIT_TYPE
    ROLLBACK_MESSAGE = records.TRANSACTION_ROLLBACK_TYPE
    UNKNOW = records.TRANSACTION_NOT_TYPE


StateOrAwaitable = LocalTransactionState | Awaitable[LocalTransactionState]
LocalTransaction = Callable[[Message, SendResult], StateOrAwaitable]
CheckListener = Callable[[MessageExt], StateOrAwaitable]


@dataclass(slots=True)
class TransactionSendResult:
    send_result: SendResult
    local_state: LocalTransactionState


async def _resolve(value: StateOrAwaitable) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):  # the common answer, checked first: this runs per transaction
        return value
    return await value if inspect.isawaitable(value) else value


def end_transaction_ext(
    group: str, queue_offset: int, commit_log_offset: int, state: int, from_check: bool, msg_id: str,
    transaction_id: str | None,
) -> dict[str, str]:  # fmt: skip
    """``EndTransactionRequestHeader(...).to_ext()`` written directly (same keys, same order): this runs for every
    transaction, and the generic encoder walks the header's field specs."""
    ext = {
        "producerGroup": group, "tranStateTableOffset": str(queue_offset), "commitLogOffset": str(commit_log_offset),
        "commitOrRollback": str(state), "fromTransactionCheck": "true" if from_check else "false", "msgId": msg_id,
    }  # fmt: skip
    if transaction_id is not None:
        ext["transactionId"] = transaction_id
    return ext


class TransactionProducer(Producer):
    """A producer of transactional messages; ``check_listener`` answers the broker's check-backs."""

    def __init__(
        self, group: str, namesrv_addr: str, check_listener: CheckListener, *, heartbeat_interval: float = 30.0,
        **kwargs: object,
    ) -> None:  # fmt: skip
        super().__init__(group, namesrv_addr, request_handler=self._on_request, **kwargs)  # type: ignore[arg-type]
        self.check_listener = check_listener
        self.heartbeat_interval = heartbeat_interval
        self._beaten: set[str] = set()
        self._beat_task: asyncio.Task | None = None
        self._checks: set[asyncio.Task] = set()

    async def start(self) -> TransactionProducer:
        await super().start()
        self._beat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        return self

    async def shutdown(self) -> None:
        for t in [self._beat_task, *self._checks]:
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        self._beat_task = None
        await super().shutdown()

    async def __aenter__(self) -> TransactionProducer:
        return await self.start()

    # -- heartbeat ----------------------------------------------------------------------------------------------
    async def _heartbeat(self, addr: str) -> None:
        body = HeartbeatData(client_id=self.client_id, producer_data_set=[ProducerData(group_name=self.group)])
        resp = await self._client.remoting.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, None,
                                                                                body.encode()))  # fmt: skip
        check(resp, f"heartbeat of producer group {self.group}", addr)
        self._beaten.add(addr)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            for addr in sorted(set(self._client.broker_addrs.values())):
                try:
                    await self._heartbeat(addr)
                except (RemotingError, MQClientError) as e:
                    log.warning("producer heartbeat to %s failed: %s", addr, e)

    # -- sending ------------------------------------------------------------------------------------------------
    async def send_in_transaction(
        self, msg: Message, local_transaction: LocalTransaction, queue: MessageQueue | None = None
    ) -> TransactionSendResult:
        """Send ``msg`` as a half message, run ``local_transaction(msg, send_result)`` and end the transaction
        with its state (an exception in it leaves the state UNKNOW: the broker will check back)."""
        if PROPERTY_PRODUCER_GROUP in msg.properties or properties.PROPERTY_TRANSACTION_PREPARED in msg.properties:
            raise MQClientError("PGROUP and TRAN_MSG are set by the transaction producer")
        # A transactional message is never delayed: the Java client drops DELAY too (sendMessageInTransaction).
        user = {k: v for k, v in msg.properties.items() if k != properties.PROPERTY_DELAY_TIME_LEVEL}
        half = Message(msg.topic, msg.body, msg.tags, msg.keys,
                       {**user, properties.PROPERTY_TRANSACTION_PREPARED: "true", PROPERTY_PRODUCER_GROUP: self.group},
                       msg.flag, msg.wait_store_msg_ok, msg.born_timestamp)  # fmt: skip
        body, props, uniq = self._prepare(half)
        mq = queue or self._pick(await self.publish_queues(half.topic), None)
        addr = await self._client.find_broker_addr(mq.broker_name, mq.topic)
        if addr not in self._beaten:
            await self._heartbeat(addr)  # the broker must know this producer before it can check back
        result = await self._send(half, body, props, uniq, mq, None, batch=False,
                                  sys_flag=records.TRANSACTION_PREPARED_TYPE)  # fmt: skip
        state = LocalTransactionState.ROLLBACK_MESSAGE
        if result.status is SendStatus.SEND_OK:
            try:
                state = await _resolve(local_transaction(msg, result))
            except Exception:
                log.exception("local transaction of %s failed: its state is UNKNOW", uniq)
                state = LocalTransactionState.UNKNOW
        _host, commit_log_offset = msgid.decode_offset_msg_id(result.offset_msg_id)
        ext = end_transaction_ext(self.group, result.queue_offset, commit_log_offset, int(state), False, uniq,
                                  result.transaction_id or uniq)  # fmt: skip
        try:
            await self._client.remoting.invoke_oneway(addr, RemotingCommand.request(RequestCode.END_TRANSACTION,
                                                                                    oneway=True, ext=ext))  # fmt: skip
        except RemotingError as e:  # the broker's check-back will resolve it
            log.warning("END_TRANSACTION of %s to %s failed: %s", uniq, addr, e)
        return TransactionSendResult(result, state)

    # -- check-back ---------------------------------------------------------------------------------------------
    async def _on_request(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            task = asyncio.ensure_future(self._check(cmd, conn))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)
            return None
        if cmd.is_oneway:
            return None
        return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {cmd.code} not supported")

    async def _check(self, cmd: RemotingCommand, conn: Channel) -> None:
        """``checkTransactionState``: ask the listener, answer END_TRANSACTION ``fromTransactionCheck=true``."""
        req = cmd.read_header(h.CheckTransactionStateRequestHeader)
        msgs = decode_messages(cmd.body, req.broker_name or "", f"check from {conn.remote_addr}")
        if not msgs:
            log.warning("CHECK_TRANSACTION_STATE from %s without a message", conn.remote_addr)
            return
        msg = msgs[0]
        remark = None
        try:
            state = await _resolve(self.check_listener(msg))
        except Exception as e:
            log.exception("check listener failed for %s", msg.msg_id)
            state, remark = LocalTransactionState.UNKNOW, f"check listener failed: {e}"
        ext = end_transaction_ext(self.group, req.tran_state_table_offset, req.commit_log_offset, int(state), True,
                                  msg.msg_id or req.msg_id or "", req.transaction_id)  # fmt: skip
        end = RemotingCommand.request(RequestCode.END_TRANSACTION, oneway=True, ext=ext)
        end.remark = remark
        try:
            await conn.send_oneway(end)
        except RemotingError as e:
            log.warning("END_TRANSACTION (check) to %s failed: %s", conn.remote_addr, e)
