"""Runs of consecutive CommitLog records built at once: the send path's encode, append and message ids.

A send's records are encoded outside the put lock into one ``bytes`` (a *run*); inside the lock
:func:`write_run` copies the run into the segment in one piece and back-fills what only the lock knows, and
:func:`offset_msg_ids` gives the reply's ``msgId``.  For a SEND_BATCH_MESSAGE, :func:`encode_batch` goes from
the MessageBatch body straight to the run.  These are the references; ``store/format/_runs.pyx`` is the
compiled twin (chosen by :mod:`store.format.native`), which hands anything unusual back to them.
"""

from __future__ import annotations

import struct

from store.errors import MQLakeError
from store.format import native, properties, records
from store.format.batch_body import BatchBodyError, decode_batch_body
from store.format.msgid import Host, create_offset_msg_id

_INT = struct.Struct(">i")


class RunError(MQLakeError, ValueError):
    """A run that cannot be written, or a batch whose messages the broker refuses (the reason says which)."""


def with_property(props: bytes, name: str, value: str) -> bytes:
    """``props`` with ``name=value`` appended unless the property is there; the client's bytes are kept as they
    came (the broker's CLUSTER on a send)."""
    if properties.property_value(props, name) is not None:
        return props
    return properties.append_properties(props, {name: value})


def encode_message(
    topic: str, queue_id: int, body: bytes, props: bytes, flag: int, sys_flag: int, born_timestamp: int,
    born_host: Host, store_host: Host, reconsume_times: int, cluster: str,
) -> bytes:  # fmt: skip
    """One sent message's record as ``records.encode_record`` makes it, with the broker's CLUSTER property added."""
    return records.encode_record(
        records.MessageRecord(
            topic=topic, queue_id=queue_id, body=body,
            properties=with_property(props, properties.PROPERTY_CLUSTER, cluster), flag=flag, sys_flag=sys_flag,
            born_timestamp=born_timestamp, born_host=born_host, store_host=store_host,
            reconsume_times=reconsume_times,
        )  # fmt: skip
    )


def encode_batch(
    body: bytes, topic: str, queue_id: int, sys_flag: int, born_timestamp: int, born_host: Host,
    store_host: Host, reconsume_times: int, cluster: str, max_body: int,
) -> tuple[bytes, int]:  # fmt: skip
    """(the run, its record count) of a SEND_BATCH_MESSAGE body (``MessageDecoder.decodeMessages``): each item
    becomes a record of ``topic``/``queue_id`` with its own flag and properties plus CLUSTER.  A malformed or
    empty body raises :class:`BatchBodyError`, an item body over ``max_body`` :class:`RunError`, properties no
    record can hold :class:`records.RecordEncodeError`."""
    items = decode_batch_body(body)
    if not items:
        raise BatchBodyError("empty batch")
    out = []
    for it in items:
        if len(it.body) > max_body:
            raise RunError(f"body of {len(it.body)} bytes exceeds maxMessageSize {max_body}")
        out.append(
            encode_message(topic, queue_id, it.body, it.properties, it.flag, sys_flag, born_timestamp, born_host,
                           store_host, reconsume_times, cluster)  # fmt: skip
        )
    return b"".join(out), len(out)


def _record_sizes(run: bytes | memoryview, count: int) -> list[int]:
    sizes: list[int] = []
    pos = 0
    for _ in range(count):
        if len(run) - pos < records.MIN_RECORD_SIZE:
            raise RunError(f"run of {len(run)} bytes ends inside record {len(sizes)} at byte {pos}")
        (size,) = _INT.unpack_from(run, pos)
        if size < records.MIN_RECORD_SIZE or size > len(run) - pos:
            raise RunError(f"record {len(sizes)} at byte {pos} of the run has TOTALSIZE {size}")
        sizes.append(size)
        pos += size
    if pos != len(run) or count < 1:
        raise RunError(f"{count} records end at byte {pos} of a run of {len(run)} bytes")
    return sizes


def write_run(
    dest: records.WriteBuffer, pos: int, run: bytes, count: int, queue_offset: int, physical_offset: int,
    store_timestamp: int, advances: bool,
) -> None:  # fmt: skip
    """Copy the ``count`` records of ``run`` to ``dest[pos:]`` and back-fill each (``records.patch_record``):
    queue offsets from ``queue_offset`` (all ``queue_offset`` unless ``advances``), physical offsets from
    ``physical_offset``, the store time.  The first record's TOTALSIZE and MAGIC are written last: until then
    ``dest`` holds zeros there, which recovery reads as the end of the log.  A run whose sizes do not add up
    raises :class:`RunError` before anything is written."""
    sizes = _record_sizes(run, count)
    head = records.SIZE_MAGIC_LENGTH
    n = len(run)
    if pos < 0 or pos + n > len(dest):
        raise RunError(f"run of {n} bytes at {pos} does not fit a buffer of {len(dest)}")
    dest[pos + head : pos + n] = memoryview(run)[head:]
    p, q = pos, queue_offset
    for size in sizes:
        records.patch_record(dest, p, q, physical_offset + p - pos, store_timestamp)
        p += size
        if advances:
            q += 1
    dest[pos : pos + head] = run[:head]


def put_run(
    dest: records.WriteBuffer, pos: int, limit: int, item: tuple[bytes, int, bool], queue_offset: int,
    physical_offset: int, store_timestamp: int,
) -> int:  # fmt: skip
    """The CommitLog's encoder (``CommitLog.put``) of a run: ``item`` is (the run, its record count, whether they
    advance the queue), written by :func:`write_run` at ``pos``; its size, or minus it, writing nothing, when it
    would end past ``limit``."""
    run, count, advances = item
    n = len(run)
    if pos + n > limit:
        return -n
    write_run(dest, pos, run, count, queue_offset, physical_offset, store_timestamp, advances)
    return n


def offset_msg_ids(store_host: Host, offset: int, run: bytes, count: int) -> str:
    """The reply's ``msgId``: the offset message id of each record of ``run`` appended at ``offset``,
    comma-separated (a batch's, as Java's ``SendMessageResponseHeader`` carries them)."""
    ids = []
    for size in _record_sizes(run, count):
        ids.append(create_offset_msg_id(store_host, offset))
        offset += size
    return ",".join(ids)


native.install(globals(), "store.format._runs", ("encode_message", "encode_batch", "write_run", "offset_msg_ids"))
