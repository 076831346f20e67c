"""Transactions: END_TRANSACTION (37) and the check-back service (``EndTransactionProcessor``,
``TransactionalMessageServiceImpl``, ``TransactionalMessageCheckService``), over the half/op records of
``half_messages``.

END_TRANSACTION (oneway from the producer): COMMIT re-puts the half message as the real one (sysFlag COMMIT,
PREPARED TRANSACTION OFFSET = the half's CommitLog offset) then writes the op; ROLLBACK writes only the op;
UNKNOWN does nothing. The half message is found by ``commitLogOffset`` and must be a half message whose PGROUP,
queue offset and CommitLog offset match the header. A request for an unknown offset or for a transaction already
resolved (by either END_TRANSACTION or an earlier check-back answer) is logged and ignored: nothing is delivered
twice.

The check service runs every ``transactionCheckInterval`` ms. From the progress offset of group
``CID_RMQ_SYS_TRANS`` it walks the half queue up to the end it saw when the round began: resolved halves are
passed; one checked ``transactionCheckMax`` times (or older than ``fileReservedTime``) moves to
``TRANS_CHECK_MAX_TIME_TOPIC``; the round stops at the first half younger than ``transactionTimeOut`` (a half with
``CHECK_IMMUNITY_TIME_IN_SECONDS`` still inside it is re-put at the end instead, so it does not hold the others
back); any other half is re-put with its check count raised and CHECK_TRANSACTION_STATE (39) goes oneway to a live
channel of its producer group, which answers with END_TRANSACTION ``fromTransactionCheck=true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import struct
import time
from collections.abc import Awaitable

from broker.remoting import tx_codec
from broker.remoting.codes import CURRENT_VERSION, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.errors import RemotingError
from broker.remoting.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from broker.server import half_messages as hm
from broker.server import topics as tp
from broker.server.context import BrokerContext
from store.config import FlushDiskType
from store.constants import TRANS_CHECK_GROUP
from store.format import msgid, records
from store.format import properties as P
from store.format import transaction as tx_format
from store.message_store import GetMessageStatus, Run

log = logging.getLogger(__name__)

_RW = tp.PERM_READ | tp.PERM_WRITE


def _now() -> int:
    return int(time.time() * 1000)


class TransactionProcessor:
    """END_TRANSACTION and the check-back service of one broker."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self.resolved = hm.ResolvedHalves()
        self._uniq = msgid.UniqKeyGenerator()
        self._task: asyncio.Task | None = None
        self._checks: set[asyncio.Task] = set()
        # What the oneway END_TRANSACTIONs of one loop turn resolved, written when the turn ends: the committed
        # messages as one batch per real queue (about the whole in-flight window arrives in one turn), then one op.
        self._turn_scheduled = False
        self._pending_commits: dict[tuple[str, int], list[_Pending]] = {}
        self._pending_ops: list[int] = []

    def routes(self) -> dict[int, Handler]:
        return {RequestCode.END_TRANSACTION: self.end_transaction}

    # --- state --------------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Rebuild which half messages are resolved from the whole op queue (a worker thread, at start-up)."""
        store = self.broker.store
        offset = store.get_min_offset_in_queue(hm.OP_TOPIC, hm.HALF_QUEUE_ID)
        while True:
            got = store.get_message(hm.OP_TOPIC, hm.HALF_QUEUE_ID, offset, 32)
            for raw in got.messages:
                op = _decode(raw)
                if op is not None:
                    self.resolved.add(hm.op_offsets(op))
            if got.next_begin_offset <= offset:
                break
            offset = got.next_begin_offset
        log.info("transactions: %d resolved half offsets loaded from %s", len(self.resolved), hm.OP_TOPIC)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._check_loop(), name="transaction-check")

    async def stop(self) -> None:
        if self._pending_commits or self._pending_ops:  # only a started broker (one with a store) has any
            self._end_turn()
        tasks = [t for t in (self._task, *self._checks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    def _read_half(self, commit_log_offset: int) -> hm.StoredHalf | None:
        """The half message starting at ``commit_log_offset``, or None unless a half message starts there: the one
        a send just stored if it is still remembered, else read from the CommitLog."""
        fresh = self.broker.recent_halves.get(commit_log_offset, _now() - self.broker.config.transaction_time_out)
        if fresh is not None:
            return fresh
        raw = self.broker.store.look_message_by_offset(commit_log_offset)
        rec = None if raw is None else _decode(raw)
        if raw is None or rec is None or rec.topic != hm.HALF_TOPIC or rec.physical_offset != commit_log_offset:
            return None
        return hm.StoredHalf.of(rec, bytes(raw))

    def _op(self, offsets: list[int]) -> records.MessageRecord:
        return hm.op_record(offsets, self._uniq.next(), self._store_host(), _now())

    async def _write_op(self, offsets: list[int]) -> bool:
        self.broker.topics.create_system_topic(hm.OP_TOPIC, 1, _RW)
        result = await self.broker.put([self._op(offsets)])
        if not result.ok:
            log.error("op message for half offsets %s not written: %s", offsets, result.error or result.status)
        return result.ok

    def _store_host(self) -> records.Host:
        return msgid.parse_host_string(self.broker.config.broker_addr)

    # --- END_TRANSACTION ----------------------------------------------------------------------------------------
    def end_transaction(
        self, cmd: RemotingCommand, conn: Channel
    ) -> RemotingCommand | Awaitable[RemotingCommand | None] | None:
        """A plain function, as the send path: in ASYNC_FLUSH nothing waits, so no task per request, and a oneway
        request (the producer's own END_TRANSACTION) gets no response built; the op messages of every
        END_TRANSACTION handled in one loop turn are written as one (5.x's comma-separated op body). In SYNC_FLUSH
        the coroutine waits until the committed message and its op are durable."""
        group, queue_offset, clog_offset, kind, from_check, msg_id = read_end_transaction_header(cmd)
        if kind not in (records.TRANSACTION_COMMIT_TYPE, records.TRANSACTION_ROLLBACK_TYPE):
            if kind != records.TRANSACTION_NOT_TYPE:
                log.warning("END_TRANSACTION from %s with commitOrRollback %d: ignored", conn.remote_addr, kind)
            return _answer(cmd, ResponseCode.SUCCESS)  # UNKNOW: the check-back will ask again
        what = "commit" if kind == records.TRANSACTION_COMMIT_TYPE else "rollback"
        half = self._read_half(clog_offset)
        refused = self._validate(group, queue_offset, half)
        if refused is not None:
            log.warning("END_TRANSACTION %s from %s (group %s, offset %d/%d, msgId %s) ignored: %s", what,
                        conn.remote_addr, group, queue_offset, clog_offset, msg_id, refused)  # fmt: skip
            return _answer(cmd, ResponseCode.SYSTEM_ERROR, refused)
        assert half is not None  # _validate refuses a missing one
        if not from_check and self._immunity_passed(half):
            log.warning("END_TRANSACTION %s for %s after its check immunity: left to the check-back", what, msg_id)
            late = "the check immunity time has passed: wait for the check"
            return _answer(cmd, ResponseCode.ILLEGAL_OPERATION, late)
        final: _Commit | None = None
        if kind == records.TRANSACTION_COMMIT_TYPE:
            target = hm.real_target(half)
            if target is None:
                return _answer(cmd, ResponseCode.SYSTEM_ERROR, "the half message has no usable REAL_TOPIC/REAL_QID")
            try:
                final = (*target, tx_format.commit_record(half.raw, *target, half.physical_offset))
            except (records.RecordError, records.RecordEncodeError) as e:  # a REAL_TOPIC no record can hold
                return _answer(cmd, ResponseCode.SYSTEM_ERROR, str(e))
        offsets = sorted({half.queue_offset, hm.origin_offset(half)})
        self.resolved.add(offsets)  # at once: a concurrent request for the same transaction is ignored
        self.broker.recent_halves.discard(half.physical_offset)
        if self.broker.store_config.flush_disk_type == FlushDiskType.SYNC_FLUSH:
            return self._end_and_wait(cmd, final, offsets)
        if final is not None and cmd.is_oneway and not half.parks:
            self._defer(offsets, final)  # nobody waits for an answer: appended with the others of this turn
            return None
        if final is not None:
            result, _ = self.broker.store.put_nowait([_record(final)])
            if not result.ok:
                self.resolved.discard(offsets)
                return _answer(cmd, ResponseCode.SYSTEM_ERROR, result.error or result.status.value)
            self.broker.stats.put(final[0], 1, result.append.wrote_bytes if result.append else 0)
        self._defer(offsets)
        return _answer(cmd, ResponseCode.SUCCESS)

    async def _end_and_wait(
        self, cmd: RemotingCommand, final: _Commit | None, offsets: list[int]
    ) -> RemotingCommand | None:
        try:
            if final is not None:
                result = await self.broker.put([_record(final)])
                if not result.ok:
                    self.resolved.discard(offsets)
                    return _answer(cmd, ResponseCode.SYSTEM_ERROR, result.error or result.status.value)
            await self._write_op(offsets)
        except BaseException:
            self.resolved.discard(offsets)
            raise
        return _answer(cmd, ResponseCode.SUCCESS)

    def _defer(self, offsets: list[int], final: _Commit | None = None) -> None:
        """The op for ``offsets`` (and the committed message ``final``), written when this loop turn ends."""
        if not self._turn_scheduled:
            self._turn_scheduled = True
            asyncio.get_running_loop().call_soon(self._end_turn)
        if final is None:
            self._pending_ops.extend(offsets)
        else:
            topic, queue_id, raw = final
            self._pending_commits.setdefault((topic, queue_id), []).append((raw, offsets))

    def _end_turn(self) -> None:
        """Append the turn's committed messages, one run per queue (their records are ready: ``commit_record``),
        then one op for every transaction whose resolution is stored: a run that fails leaves its transactions
        unresolved, for the check-back."""
        self._turn_scheduled = False
        commits, self._pending_commits = self._pending_commits, {}
        offsets, self._pending_ops = self._pending_ops, []
        store = self.broker.store
        for (topic, queue_id), pending in commits.items():
            for batch in _batches(pending):
                run = b"".join([raw for raw, _ in batch])
                # like Java's re-put of a committed message, it never waits for a flush (ASYNC_FLUSH here anyway)
                result, _ = store.put_nowait(Run(run, len(batch), topic, queue_id, records.TRANSACTION_COMMIT_TYPE),
                                             wait=False)  # fmt: skip
                if result.ok:
                    self.broker.stats.put(topic, len(batch), result.append.wrote_bytes if result.append else 0)
                    offsets.extend(o for _, done in batch for o in done)
                else:
                    log.error("%d committed messages for %s:%d not written: %s", len(batch), topic, queue_id,
                              result.error or result.status)  # fmt: skip
                    for _, done in batch:
                        self.resolved.discard(done)
        if not offsets:
            return
        self.broker.topics.create_system_topic(hm.OP_TOPIC, 1, _RW)
        result, _ = store.put_nowait([self._op(offsets)])
        if not result.ok:  # the check-back will ask about them again
            log.error("op message for half offsets %s not written: %s", offsets, result.error or result.status)

    def _validate(self, group: str, queue_offset: int, half: hm.StoredHalf | None) -> str | None:
        if half is None:
            return "Find prepared transaction message failed"
        if hm.prop(half, P.PROPERTY_PRODUCER_GROUP) != group:
            return "The producer group wrong"
        if half.queue_offset != queue_offset:
            return "The transaction state table offset wrong"
        if self.resolved.is_resolved(half):
            return "The transaction is already resolved"
        return None

    def _immunity_passed(self, half: hm.StoredHalf) -> bool:
        """``rejectCommitOrRollback``: a producer's own END_TRANSACTION after its custom first-check time."""
        value = hm.prop(half, P.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        if not value:
            return False
        return _now() - half.born_timestamp > self._immunity_ms(value)

    def _immunity_ms(self, value: str) -> int:
        timeout = self.broker.config.transaction_time_out
        try:
            seconds = int(value)
        except ValueError:
            return timeout
        return timeout if seconds == -1 else seconds * 1000

    # --- check-back ---------------------------------------------------------------------------------------------
    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.broker.config.transaction_check_interval / 1000)
            try:
                await self.check()
            except Exception:
                log.exception("transaction check failed")

    async def check(self) -> None:
        """One round over the half queue (``TransactionalMessageServiceImpl.check``)."""
        b = self.broker
        if b.topics.get(hm.HALF_TOPIC) is None:
            return
        store = b.store
        progress = b.offsets.query(TRANS_CHECK_GROUP, hm.HALF_TOPIC, hm.HALF_QUEUE_ID)
        if progress < 0:
            progress = store.get_min_offset_in_queue(hm.HALF_TOPIC, hm.HALF_QUEUE_ID)
        end = store.get_max_offset_in_queue(hm.HALF_TOPIC, hm.HALF_QUEUE_ID)  # copies put now wait for a next round
        self.resolved.prune_below(store.get_min_offset_in_queue(hm.HALF_TOPIC, hm.HALF_QUEUE_ID))
        timeout, check_max = b.config.transaction_time_out, b.config.transaction_check_max
        offset = max(progress, store.get_min_offset_in_queue(hm.HALF_TOPIC, hm.HALF_QUEUE_ID))
        while offset < end and not b.stopping:
            got = store.get_message(hm.HALF_TOPIC, hm.HALF_QUEUE_ID, offset, 1)
            if got.status != GetMessageStatus.FOUND:
                offset = max(got.next_begin_offset, offset + 1)
                continue
            half = _decode(got.messages[0])
            if half is not None and not await self._check_one(half, timeout, check_max):
                break  # too young: so are the ones after it
            offset += 1
            b.offsets.commit(TRANS_CHECK_GROUP, hm.HALF_TOPIC, hm.HALF_QUEUE_ID, offset)
            await asyncio.sleep(0)  # a long queue must not hold the loop

    async def _check_one(self, half: records.MessageRecord, timeout: int, check_max: int) -> bool:
        """Handle one unprocessed half message; False when it is too young and the round must stop."""
        if self.resolved.is_resolved(half):
            return True
        times = hm.check_times(half)
        age = _now() - half.born_timestamp
        if times >= max(check_max, 1) or age > self.broker.store_config.file_reserved_time * 3_600_000:
            log.error("half message %s (%s) checked %d times: moved to %s", half.uniq_key, half.offset_msg_id, times,
                      hm.CHECK_MAX_TIME_TOPIC)  # fmt: skip
            self.broker.topics.create_system_topic(hm.CHECK_MAX_TIME_TOPIC, 1, _RW)
            await self.broker.put([hm.discarded(half)])
            return True
        immunity = hm.prop(half, P.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        limit = self._immunity_ms(immunity) if immunity is not None else timeout
        if 0 <= age <= limit:
            if immunity is None:
                return False
            await self.broker.put([hm.renewed(half, None)])  # checked later, without holding the queue back
            return True
        result = await self.broker.put([hm.renewed(half, times + 1)])
        if not result.ok or result.append is None:
            log.error("half message %s not re-put for its check: %s", half.uniq_key, result.error or result.status)
            return False
        copy = _decode(self.broker.store.look_message_by_offset(result.append.wrote_offset) or b"")
        if copy is not None:
            self._send_check(copy)
        return True

    def _send_check(self, half: records.MessageRecord) -> None:
        """CHECK_TRANSACTION_STATE to one live channel of the half message's producer group."""
        group = hm.prop(half, P.PROPERTY_PRODUCER_GROUP) or ""
        channels = self.broker.producers.groups.get(group)
        if not channels:
            log.warning("check of %s skipped: producer group %r has no live channel", half.uniq_key, group)
            return
        target = hm.real_target(half)
        if target is None:
            log.error("half message %s has no REAL_TOPIC/REAL_QID: not checked", half.offset_msg_id)
            return
        channel = max(channels.values(), key=lambda c: c.last_update)
        header = CheckTransactionStateRequestHeader(
            tran_state_table_offset=half.queue_offset, commit_log_offset=half.physical_offset, msg_id=half.uniq_key,
            transaction_id=half.uniq_key, offset_msg_id=half.offset_msg_id, topic=half.topic,
            broker_name=self.broker.config.broker_name,
        )  # fmt: skip
        shown = dataclasses.replace(half, topic=target[0], queue_id=target[1], _props=None)
        cmd = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, header, records.encode_record(shown),
                                      oneway=True)  # fmt: skip
        cmd.language = "JAVA"
        cmd.version = CURRENT_VERSION
        task = asyncio.ensure_future(self._send(channel.conn, cmd))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    @staticmethod
    async def _send(conn: Channel, cmd: RemotingCommand) -> None:
        try:
            await conn.send_oneway(cmd)
        except RemotingError as e:
            log.warning("CHECK_TRANSACTION_STATE to %s failed: %s", conn.remote_addr, e)


# A batch never straddles two CommitLog segments: one of at most this many bytes (or of one record) wastes little
# of a segment's end when it does not fit there.
_BATCH_BYTES = 256 * 1024


_Commit = tuple[str, int, bytes]  # a committed message: its real topic and queue, its record
_Pending = tuple[bytes, list[int]]  # a committed message's record and the half offsets it resolves


def _batches(pending: list[_Pending]) -> list[list[_Pending]]:
    """``pending`` cut into runs of at most ``_BATCH_BYTES`` of records."""
    out: list[list[_Pending]] = [[]]
    size = 0
    for item in pending:
        n = len(item[0])
        if out[-1] and size + n > _BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out


def _record(final: _Commit) -> records.MessageRecord:
    """A committed message as a record to put (the rare paths: SYNC_FLUSH, an answer awaited, a delay to park)."""
    rec = records.decode_record(final[2])
    rec.queue_offset = rec.physical_offset = rec.store_timestamp = 0  # the append's, as for any put
    return rec


def read_end_transaction_header(cmd: RemotingCommand) -> tx_codec.EndFields:
    """What END_TRANSACTION's header says, read in one call (``tx_codec.read_end_transaction``: this runs for
    every transaction); anything missing or malformed takes the generic parser, so its HeaderError is the one a
    client sees."""
    fields = tx_codec.read_end_transaction(cmd.ext_fields)
    if fields is not None:
        return fields
    h = cmd.read_header(EndTransactionRequestHeader)
    return (h.producer_group, h.tran_state_table_offset, h.commit_log_offset, h.commit_or_rollback,
            h.from_transaction_check, h.msg_id)  # fmt: skip


def _answer(cmd: RemotingCommand, code: int, remark: str | None = None) -> RemotingCommand | None:
    """The response, unless the request is oneway (nothing would be sent: none is built)."""
    return None if cmd.is_oneway else cmd.response(code, remark)


def _decode(raw: bytes | memoryview) -> records.MessageRecord | None:
    """A record the store handed out whole (its size is the slice's): decoded, or None (logged) if it does not."""
    try:
        return records.decode_record(raw, size=len(raw))
    except (records.RecordError, IndexError, ValueError, struct.error) as e:
        log.error("unreadable record in the transaction topics: %s", e)
        return None
