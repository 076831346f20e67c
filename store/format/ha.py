"""The master/slave replication wire format of RocketMQ 4.x (``HAConnection`` / ``HAClient``).

Two byte streams on one TCP connection, no framing beyond these headers, every integer big-endian:

- slave -> master: reports, each the 8-byte ``long`` the slave's CommitLog ends at (its ack and its request);
- master -> slave: transfers, each an 8-byte ``long`` physical offset and a 4-byte ``int`` body length, then that
  many bytes copied from the master's CommitLog at that offset.  A length of 0 is a heartbeat.
"""

from __future__ import annotations

import struct

from store.format.buffers import ReadBuffer

REPORT_HEADER_SIZE = 8  # HAClient.REPORT_HEADER_SIZE
TRANSFER_HEADER_SIZE = 12  # HAConnection.TRANSFER_HEADER_SIZE: 8 + 4

_REPORT = struct.Struct(">q")
_TRANSFER = struct.Struct(">qi")


def encode_report(max_offset: int) -> bytes:
    """What a slave sends: the end of its CommitLog."""
    return _REPORT.pack(max_offset)


def decode_report(buf: ReadBuffer, pos: int = 0) -> int:
    return int(_REPORT.unpack_from(buf, pos)[0])


def encode_transfer_header(offset: int, size: int) -> bytes:
    """The header before ``size`` CommitLog bytes starting at ``offset`` (``size`` 0: a heartbeat)."""
    return _TRANSFER.pack(offset, size)


def decode_transfer_header(buf: ReadBuffer, pos: int = 0) -> tuple[int, int]:
    """(physical offset, body length) of a transfer header."""
    offset, size = _TRANSFER.unpack_from(buf, pos)
    return int(offset), int(size)


# --- RocketMQ 5's controller mode (``AutoSwitchHAClient`` / ``AutoSwitchHAConnection``) ----------------------------
# Every frame starts with an ``int`` state, an ordinal of ``HAConnectionState``: HANDSHAKE first, then TRANSFER.
STATE_HANDSHAKE = 1
STATE_TRANSFER = 2
SLAVE_HANDSHAKE_SIZE = 16  # int state, short isSyncFromLastFile, short isAsyncLearner, long slaveBrokerId
SLAVE_REPORT_SIZE = 12  # int state, long max offset
MASTER_HANDSHAKE_SIZE = 20  # int state, int body size, long master max offset, int last epoch; then the epochs
MASTER_TRANSFER_SIZE = 36  # int state, int body size, long offset, int epoch, long epoch start, long confirm offset
EPOCH_ENTRY_SIZE = 12  # int epoch, long start offset

_SLAVE_HANDSHAKE = struct.Struct(">ihhq")
_SLAVE_REPORT = struct.Struct(">iq")
_MASTER_HANDSHAKE = struct.Struct(">iiqi")
_MASTER_TRANSFER = struct.Struct(">iiqiqq")
_EPOCH_ENTRY = struct.Struct(">iq")
_TRANSFER_TAIL = struct.Struct(">qq")


def encode_slave_handshake(slave_broker_id: int, sync_from_last_file: bool = False,
                           async_learner: bool = False) -> bytes:
    return _SLAVE_HANDSHAKE.pack(STATE_HANDSHAKE, int(sync_from_last_file), int(async_learner), slave_broker_id)


def decode_slave_handshake(buf: ReadBuffer) -> tuple[int, bool, bool, int]:
    """(state, isSyncFromLastFile, isAsyncLearner, slaveBrokerId)."""
    state, last_file, learner, broker_id = _SLAVE_HANDSHAKE.unpack_from(buf, 0)
    return int(state), last_file == 1, learner == 1, int(broker_id)


def encode_slave_report(max_offset: int) -> bytes:
    return _SLAVE_REPORT.pack(STATE_TRANSFER, max_offset)


def decode_slave_report(buf: ReadBuffer) -> tuple[int, int]:
    """(state, offset)."""
    state, offset = _SLAVE_REPORT.unpack_from(buf, 0)
    return int(state), int(offset)


def encode_master_handshake(max_offset: int, last_epoch: int, epochs: list[tuple[int, int]]) -> bytes:
    """The master's answer: its log's end, its last epoch and its whole epoch history (epoch, start offset)."""
    body = b"".join(_EPOCH_ENTRY.pack(e, start) for e, start in epochs)
    return _MASTER_HANDSHAKE.pack(STATE_HANDSHAKE, len(body), max_offset, last_epoch) + body


def decode_master_header(buf: ReadBuffer) -> tuple[int, int, int, int]:
    """(state, body size, offset, epoch): the first 20 bytes, shared by the handshake and the transfer header."""
    state, size, offset, epoch = _MASTER_HANDSHAKE.unpack_from(buf, 0)
    return int(state), int(size), int(offset), int(epoch)


def decode_epoch_entries(body: ReadBuffer) -> list[tuple[int, int]]:
    """The master handshake's body: (epoch, start offset) per 12 bytes."""
    out = []
    for i in range(0, len(body) - EPOCH_ENTRY_SIZE + 1, EPOCH_ENTRY_SIZE):
        epoch, start = _EPOCH_ENTRY.unpack_from(body, i)
        out.append((int(epoch), int(start)))
    return out


def encode_master_transfer_header(offset: int, size: int, epoch: int, epoch_start: int, confirm_offset: int) -> bytes:
    return _MASTER_TRANSFER.pack(STATE_TRANSFER, size, offset, epoch, epoch_start, confirm_offset)


def decode_master_transfer_tail(buf: ReadBuffer) -> tuple[int, int]:
    """(epoch start offset, confirm offset): the 16 bytes after a transfer header's first 20."""
    start, confirm = _TRANSFER_TAIL.unpack_from(buf, 0)
    return int(start), int(confirm)
