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
