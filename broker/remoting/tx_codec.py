"""The wire side of a transaction's two requests on the broker: the SEND_MESSAGE_V2 header of a
prepared send (as ``send_codec.read_send_v2`` reads a plain one) and the END_TRANSACTION header, each read in
one call.

These are the references; ``broker/remoting/_tx.pyx`` is the compiled twin (chosen by :mod:`store.format.native`).
Each answers None for anything but the common request, and the processor then takes its general path (the
generic header parser), which gives every unusual request the answer it always had.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.remoting.errors import HeaderError
from broker.remoting.headers import SendMessageRequestHeaderV2
from store.format import native, properties
from store.schedule import may_park

# (topic, queueId, sysFlag, flag, bornTimestamp, properties, reconsumeTimes)
HalfFields = tuple[str, int, int, int, int, bytes, int]
# (producerGroup, tranStateTableOffset, commitLogOffset, commitOrRollback, fromTransactionCheck, msgId)
EndFields = tuple[str, int, int, int, bool, str]


def read_half_v2(ext: Mapping[str, str]) -> HalfFields | None:
    """The fields of a half message's SEND_MESSAGE_V2 header, or None unless the request is the common shape: a V2
    header that parses, not a batch, not unit mode, a queue the client chose, properties that end with their
    separator (so the broker's CLUSTER is a segment of its own), say ``TRAN_MSG=true`` and ask for no delay or
    timer."""
    if "topic" in ext or "batch" in ext or ext.get("m") == "1":  # a V1 header, or a batch (pre_send reads these)
        return None
    try:
        h = SendMessageRequestHeaderV2.read_v1(ext)
    except HeaderError:
        return None
    if h.batch or h.unit_mode or h.queue_id < 0:
        return None
    try:
        props = (h.properties or "").encode("utf-8")
    except UnicodeEncodeError:
        return None
    if (props and not props.endswith(b"\x02")) or may_park(props):
        return None
    if properties.property_value(props, properties.PROPERTY_TRANSACTION_PREPARED) != "true":
        return None
    return h.topic, h.queue_id, h.sys_flag, h.flag, h.born_timestamp, props, h.reconsume_times or 0


def read_end_transaction(ext: Mapping[str, str]) -> EndFields | None:
    """The fields of an ``EndTransactionRequestHeader`` the broker acts on, or None when one is missing or does
    not parse (the generic parser then raises the HeaderError a client sees). ``fromTransactionCheck`` is read
    as Java's ``Boolean.parseBoolean``."""
    try:
        check = ext.get("fromTransactionCheck")
        return (ext["producerGroup"], int(ext["tranStateTableOffset"]), int(ext["commitLogOffset"]),
                int(ext["commitOrRollback"]), check is not None and check.lower() == "true", ext["msgId"])  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


native.install(globals(), "broker.remoting._tx", ("read_half_v2", "read_end_transaction"))
