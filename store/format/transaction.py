"""The records of a transaction as RocketMQ stores them: the half message a prepared send is parked as
(``TransactionalMessageBridge.parseHalfMessageInner``) and the real message END_TRANSACTION's commit re-puts
(``EndTransactionProcessor.endMessageTransaction``), the latter rewritten from the half's record bytes.

These are the references; ``store/format/_transaction.pyx`` is the compiled twin (chosen by
:mod:`store.format.native`), which hands anything unusual back to them.
"""

from __future__ import annotations

import struct

from store.constants import TRANS_HALF_TOPIC as HALF_TOPIC
from store.format import native, properties, records, runs
from store.format.msgid import Host

HALF_QUEUE_ID = 0
PROPERTY_TRANSACTION_ID = properties.PROPERTY_TRANSACTION_ID

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")


def half_sys_flag(sys_flag: int) -> int:
    """A half message is stored NOT_TYPE in its own topic (so it takes a queue offset there); other bits kept."""
    return (sys_flag & ~records.TRANSACTION_ROLLBACK_TYPE) | records.TRANSACTION_NOT_TYPE


def commit_sys_flag(sys_flag: int) -> int:
    """``resetTransactionValue(sysFlag, COMMIT)``."""
    return (sys_flag & ~records.TRANSACTION_ROLLBACK_TYPE) | records.TRANSACTION_COMMIT_TYPE


def half_properties(props: bytes, topic: str, queue_id: int) -> bytes:
    """The half message's properties: the sent ones (CLUSTER included) as they came, then ``__transactionId__``
    (the UNIQ_KEY, when there is one), REAL_TOPIC and REAL_QID. Appended after the client's: decoding keeps the
    last value of a name, as Java's map put would."""
    uniq = properties.property_value(props, properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    return properties.append_properties(props, {
        PROPERTY_TRANSACTION_ID: uniq, properties.PROPERTY_REAL_TOPIC: topic,
        properties.PROPERTY_REAL_QUEUE_ID: str(queue_id),
    })  # fmt: skip


def encode_half(
    topic: str, queue_id: int, body: bytes, props: bytes, flag: int, sys_flag: int, born_timestamp: int,
    born_host: Host, store_host: Host, reconsume_times: int, cluster: str,
) -> tuple[bytes, str | None, bytes]:  # fmt: skip
    """(the record, its UNIQ_KEY, its properties) of a prepared send of these fields to ``topic``/``queue_id``
    parked as a half message: the sent record (``runs.encode_message``, the broker's CLUSTER added) re-addressed
    to the half topic with :func:`half_properties` and :func:`half_sys_flag`."""
    sent = runs.with_property(props, properties.PROPERTY_CLUSTER, cluster)
    half_props = half_properties(sent, topic, queue_id)
    run = runs.encode_message(
        HALF_TOPIC, HALF_QUEUE_ID, body, half_props, flag, half_sys_flag(sys_flag), born_timestamp, born_host,
        store_host, reconsume_times, cluster,
    )  # fmt: skip
    return run, properties.property_value(sent, properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), half_props


def prepared_offset_position(sys_flag: int) -> int:
    """Where PREPAREDTRANSACTIONOFFSET sits in a record of this sysFlag (after the store time and host and
    RECONSUMETIMES)."""
    store_host = 20 if sys_flag & records.STOREHOSTADDRESS_V6_FLAG else 8
    return records.store_timestamp_position(sys_flag) + 8 + store_host + 4


def commit_record(half: bytes, topic: str, queue_id: int, half_offset: int) -> bytes:
    """The real message END_TRANSACTION's commit re-puts, from the record of the half message stored at
    ``half_offset`` (as stored, or as the send encoded it): re-addressed to ``topic``/``queue_id`` (REAL_TOPIC,
    REAL_QID), sysFlag COMMIT, PREPARED TRANSACTION OFFSET = ``half_offset``; body, CRC, flag, born time and
    host, store host, reconsume times and the properties kept (Java builds the properties string before it clears
    REAL_TOPIC/REAL_QID/TRAN_MSG from the map). Queue offset, physical offset and store time are the append's.
    A record whose lengths do not frame it raises :class:`records.RecordError`."""
    out = bytearray(records.retarget_record(half, topic, queue_id))
    (sys_flag,) = _INT.unpack_from(out, records.SYSFLAG_POS)
    _INT.pack_into(out, records.SYSFLAG_POS, commit_sys_flag(sys_flag))
    _LONG.pack_into(out, prepared_offset_position(sys_flag), half_offset)
    return bytes(out)


native.install(globals(), "store.format._transaction", ("encode_half", "commit_record"))
