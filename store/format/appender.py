"""A wire send's record, from its SEND_MESSAGE_V2 header's fields straight into the segment: the CommitLog's
encoder of the broker's fast path (the Python reference; ``store/format/_appender.pyx`` is its compiled twin).

:func:`prepare_send` takes the header's fields (``send_codec.read_send_v2``) and the broker's CLUSTER, and answers
the item :func:`put_prepared` writes, or None to decline: the store's general path (the run, ``runs``) then
puts it, or refuses it with the answer it always had.  It declines a message that may be parked (delay level,
timer), a half or rollback message, a topic that is empty or needs the V2 record, a body or properties over
their limits, an argument of another type, a cluster name or address that cannot be encoded.
:func:`put_prepared` is ``CommitLog.put``'s encoder: pure, it writes bytes given the offsets and the store time.
Pure both: no lock, no queue table, no file is known here.
"""

from __future__ import annotations

from store.format import native, properties, records, runs
from store.format.buffers import WriteBuffer
from store.format.delay import may_park
from store.format.msgid import Host, pack_ip

_INT_RANGE = 1 << 31
_LONG_RANGE = 1 << 63


def plain(rec: records.MessageRecord, max_body: int) -> bool:
    """Whether :func:`prepare_send` takes ``rec``: see the module's docstring."""
    props, body, topic, sys_flag = rec.properties, rec.body, rec.topic, rec.sys_flag
    if (
        type(props) is not bytes or type(body) is not bytes or type(topic) is not str or not topic
        or len(body) > max_body or len(props) > records.MAX_PROPERTIES_LENGTH
        or may_park(props)
        or rec.magic is not None or rec.body_crc is not None
        or type(sys_flag) is not int or not -(1 << 31) <= sys_flag < 1 << 31 or not records.is_consumable(sys_flag)
    ):  # fmt: skip
        return False
    if len(topic) > records.MAX_TOPIC_LENGTH_V1 // 4 and len(topic.encode("utf-8")) > records.MAX_TOPIC_LENGTH_V1:
        return False  # (a character is at most 4 bytes of UTF-8)
    # integers, as the compiled twin's reader takes them (out of their ranges, put_record raises struct.error)
    return (
        int is type(rec.queue_id) is type(rec.flag) is type(rec.reconsume_times) is type(rec.born_host[1])
        is type(rec.born_timestamp) is type(rec.prepared_transaction_offset) is type(rec.queue_offset)
        is type(rec.physical_offset) is type(rec.store_timestamp)
    )  # fmt: skip


def prepare_send(
    topic: str, queue_id: int, body: bytes, props: bytes, flag: int, sys_flag: int, born_timestamp: int,
    born_host: Host, reconsume_times: int, cluster: str, store_host: Host, max_body: int,
) -> records.MessageRecord | None:  # fmt: skip
    """The record ``runs.encode_message`` makes of a send's fields (``cluster`` added as the CLUSTER property
    unless there is one), as the item :func:`put_prepared` writes; None to decline (the module's docstring)."""
    if not (
        type(topic) is str and type(queue_id) is int and type(body) is bytes and type(props) is bytes
        and type(flag) is int and type(sys_flag) is int and type(born_timestamp) is int
        and type(born_host) is tuple and len(born_host) == 2 and type(born_host[0]) is str
        and type(born_host[1]) is int and type(reconsume_times) is int and type(cluster) is str
    ):  # fmt: skip
        return None
    try:
        props = runs.with_property(props, properties.PROPERTY_CLUSTER, cluster)
    except ValueError:  # a cluster name that is not UTF-8: encode_message raises it too
        return None
    rec = records.MessageRecord(
        topic=topic, queue_id=queue_id, body=body, properties=props, flag=flag, sys_flag=sys_flag,
        born_timestamp=born_timestamp, born_host=born_host, store_host=store_host, reconsume_times=reconsume_times,
    )  # fmt: skip
    if not plain(rec, max_body) or not all(
        -_INT_RANGE <= v < _INT_RANGE for v in (queue_id, flag, reconsume_times, born_host[1], store_host[1])
    ):
        return None  # (struct.error from the encoder otherwise)
    if not -_LONG_RANGE <= born_timestamp < _LONG_RANGE:
        return None
    try:
        topic.encode("utf-8")
        pack_ip(born_host[0])
        pack_ip(store_host[0])
    except ValueError:  # a topic of surrogates, an address that is none
        return None
    return rec


def put_prepared(
    dest: WriteBuffer, pos: int, limit: int, item: records.MessageRecord, queue_offset: int, physical_offset: int,
    store_timestamp: int,
) -> int:  # fmt: skip
    """``CommitLog.put``'s encoder of an item of :func:`prepare_send`: ``records.put_record`` (a field out of its
    range raises ``struct.error``, an address ``pack_ip`` refuses ``ValueError``, before anything is written)."""
    return records.put_record(dest, pos, limit, item, queue_offset, physical_offset, store_timestamp)


# The compiled twin (store/format/_appender.pyx) replaces them when it is built; see store.format.native.
native.install(globals(), "store.format._appender", ("prepare_send", "put_prepared"))
