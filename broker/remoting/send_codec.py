"""The wire side of the send fast path: a common SEND_MESSAGE_V2's header (a plain message's or a transaction's
half message's) read in one call, and a send's reply frame built in one call.

These are the references; ``broker/remoting/_send.pyx`` is the compiled twin (chosen by
:mod:`store.format.native`).  ``read_send_v2`` answers None for anything but the common request, and the
processor then takes its general path, which gives every unusual request the answer it always had.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.remoting.codes import FLAG_RESPONSE, ResponseCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import HeaderError
from broker.remoting.headers import SendMessageRequestHeaderV2
from store.format import native, properties, records
from store.schedule import may_park

# (topic, queueId, sysFlag, flag, bornTimestamp, properties, reconsumeTimes, UNIQ_KEY or None, a half message)
SendFields = tuple[str, int, int, int, int, bytes, int, str | None, bool]


def read_send_v2(ext: Mapping[str, str]) -> SendFields | None:
    """The fields of a SEND_MESSAGE_V2 header the fast path needs, or None unless the request is the common
    shape: a V2 header that parses, not a batch, not unit mode, a queue the client chose, properties that end with
    their separator (so the broker's CLUSTER is a segment of its own) and ask for no delay or timer, and either a
    transaction's half message (``TRAN_MSG=true``, the last field true) or a message with no transaction bits and
    no TRAN_MSG."""
    if "topic" in ext or "batch" in ext or "b" not in ext:  # a V1 header, or V1's batch flag (pre_send reads it)
        return None
    try:
        h = SendMessageRequestHeaderV2.read_v1(ext)
    except HeaderError:
        return None
    if h.batch or ext.get("m") == "1" or h.unit_mode or h.queue_id < 0:
        return None
    try:
        props = (h.properties or "").encode("utf-8")
    except UnicodeEncodeError:
        return None
    if (props and not props.endswith(b"\x02")) or may_park(props):
        return None
    half = properties.property_value(props, properties.PROPERTY_TRANSACTION_PREPARED) == "true"
    # prepared, commit or rollback bits, or a TRAN_MSG that is not true: the general path
    if not half and (h.sys_flag & records.TRANSACTION_ROLLBACK_TYPE or b"TRAN_MSG\x01" in props):
        return None
    uniq = properties.property_value(props, properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    return h.topic, h.queue_id, h.sys_flag, h.flag, h.born_timestamp, props, h.reconsume_times or 0, uniq, half


def send_reply(
    opaque: int, serialize_type: int, msg_id: str, queue_id: int, queue_offset: int, transaction_id: str | None,
    region: str, trace_on: bool,
) -> bytes:  # fmt: skip
    """The whole SUCCESS frame answering a send (``SendMessageResponseHeader`` plus MSG_REGION and TRACE_ON), as
    ``RemotingCommand.response`` and the connection's reply would encode it."""
    ext = {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset)}
    if transaction_id is not None:
        ext["transactionId"] = transaction_id
    ext[properties.PROPERTY_MSG_REGION] = region
    ext[properties.PROPERTY_TRACE_SWITCH] = "true" if trace_on else "false"
    return RemotingCommand(
        code=ResponseCode.SUCCESS, opaque=opaque, flag=FLAG_RESPONSE, ext_fields=ext,
        serialize_type=SerializeType(serialize_type),
    ).encode()  # fmt: skip


native.install(globals(), "broker.remoting._send", ("read_send_v2", "send_reply"))
