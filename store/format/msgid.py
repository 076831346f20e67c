"""Hosts as records store them, and message ids: the offset msgId (``MessageDecoder.createMessageId``) and the
client's UNIQ_KEY (``MessageClientIDSetter``)."""

from __future__ import annotations

import functools
import ipaddress
import itertools
import os
import random
import socket
import struct
import threading
import time
from datetime import datetime

from store.errors import MQLakeError

Host = tuple[str, int]

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")


class MessageIdError(MQLakeError, ValueError):
    """A string that is not an offset message id."""


@functools.lru_cache(maxsize=4096)
def pack_ip(ip: str) -> bytes:
    """4 (IPv4) or 16 (IPv6) address bytes."""
    return ipaddress.ip_address(ip).packed


def encode_host(host: Host) -> bytes:
    """Socket address as stored: 4 (or 16) address bytes + 4-byte port."""
    ip, port = host
    return pack_ip(ip) + _INT.pack(port)


@functools.lru_cache(maxsize=4096)  # few distinct hosts; ipaddress's text form costs microseconds per record
def decode_addr(raw: bytes) -> str:
    """The text form of 4 or 16 address bytes."""
    return str(ipaddress.ip_address(raw))


def host_string(host: Host) -> str:
    """``ip:port``, as the Python client shows hosts (IPv6 unbracketed; split on the last colon)."""
    return f"{host[0]}:{host[1]}"


def parse_host_string(text: str) -> Host:
    ip, _, port = text.rpartition(":")
    return ip, int(port)


@functools.lru_cache(maxsize=256)
def _host_hex(host: Host) -> str:
    return encode_host(host).hex().upper()


def create_offset_msg_id(store_host: Host, physical_offset: int) -> str:
    """``MessageDecoder.createMessageId``: upper-case hex of store ip + port + physical offset."""
    return f"{_host_hex(store_host)}{physical_offset & 0xFFFFFFFFFFFFFFFF:016X}"


def decode_offset_msg_id(msg_id: str) -> tuple[Host, int]:
    """``decodeMessageId``: 32 hex characters are IPv4, 56 are IPv6."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as e:
        raise MessageIdError(f"message id {msg_id!r} is not hex") from e
    if len(raw) not in (16, 28):
        raise MessageIdError(f"message id {msg_id!r} has {len(msg_id)} hex characters, expected 32 or 56")
    n = len(raw) - 12
    return (decode_addr(raw[:n]), _INT.unpack_from(raw, n)[0]), _LONG.unpack_from(raw, n + 4)[0]


def _start_of_month_ms(now_ms: int) -> int:
    d = datetime.fromtimestamp(now_ms / 1000).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    # Where local midnight happens twice or not at all, java.util.Calendar lands on the later instant.
    return int(max(d.timestamp(), d.replace(fold=1).timestamp()) * 1000)


def _local_ip_bytes() -> bytes:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # UDP connect sends nothing; it picks the outbound address
            return socket.inet_aton(s.getsockname()[0])
    except OSError:
        return _INT.pack(int(time.time()) & 0x7FFFFFFF)


class UniqKeyGenerator:
    """``MessageClientIDSetter``: ip + pid(short) + loader hash(int) + ms since month start + counter."""

    def __init__(self, ip: bytes | None = None, pid: int | None = None, salt: int | None = None) -> None:
        ip = ip if ip is not None else _local_ip_bytes()
        pid = (os.getpid() if pid is None else pid) & 0xFFFF
        salt = random.getrandbits(32) if salt is None else salt & 0xFFFFFFFF
        self._prefix = (ip + struct.pack(">HI", pid, salt)).hex().upper()
        self._counter = itertools.count(random.getrandbits(16))
        self._lock = threading.Lock()
        self._month_start = 0
        self._next_month = 0

    def next(self, now_ms: int | None = None) -> str:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            if now >= self._next_month or now < self._month_start:
                self._month_start = _start_of_month_ms(now)
                self._next_month = _start_of_month_ms(self._month_start + 32 * 86_400_000)
            diff = now - self._month_start
            count = next(self._counter) & 0xFFFF
        diff = 0 if -1_000_000 < diff < 0 else diff
        return self._prefix + struct.pack(">IH", diff & 0xFFFFFFFF, count).hex().upper()
