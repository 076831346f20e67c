"""RocketMQ's white-list address patterns (``RemoteAddressStrategyFactory``): which peers skip the signature check.

A pattern is one of
- blank: matches nothing;
- ``*``, ``*.*.*.*`` or ``*:*:*:*:*:*:*:*``: matches every address;
- ``192.168.1.{1,2,3}``: the last part a ``{...}`` list;
- ``192.168.1.1,192.168.1.2``: a comma list of whole addresses;
- ``192.168.*.*``, ``192.168.1.1-10``, ``192.168.1-10.*``: the first part that is ``*`` or ``a-b`` is a range
  and every part after it matches anything (as RocketMQ reads it);
- one address, IPv4 or IPv6.
IPv6 addresses compare in their expanded form; IPv6 wildcards and ranges are refused (mqlake has none yet).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass

from store.errors import MQLakeError

_COMMA_OUTSIDE_BRACES = re.compile(r",(?![^{]*\})")


def split_list(text: str | None) -> list[str]:
    """A ","-joined list as the ACL admin headers carry it; a ``{1,2}`` address list stays one item."""
    return [item.strip() for item in _COMMA_OUTSIDE_BRACES.split(text or "") if item.strip()]


class AddressPatternError(MQLakeError, ValueError):
    """A white-list address pattern RocketMQ would refuse; the message quotes it."""


@functools.lru_cache(maxsize=4096)  # peers are few and each sends many requests
def _normal(addr: str) -> str:
    """The canonical text of an address (IPv6 expanded, IPv4-mapped IPv6 as IPv4); unparsable text unchanged."""
    try:
        ip = ipaddress.ip_address(addr.strip().strip("[]"))
    except ValueError:
        return addr.strip()
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ip.ipv4_mapped) if ip.ipv4_mapped is not None else ip.exploded
    return str(ip)


def _address(text: str, pattern: str) -> str:
    try:
        return _normal(str(ipaddress.ip_address(text.strip())))
    except ValueError:
        raise AddressPatternError(f"address pattern {pattern!r}: {text.strip()!r} is not an IP address") from None


def _octet(text: str, pattern: str) -> int:
    if not text.strip().isdigit() or not 0 <= int(text) <= 255:
        raise AddressPatternError(f"address pattern {pattern!r}: {text!r} is not a number 0-255")
    return int(text)


@dataclass(frozen=True, slots=True)
class AddressPattern:
    """A compiled pattern: ``matches(ip)`` for the peer's IP address (without its port)."""

    text: str
    any: bool = False
    addresses: frozenset[str] = frozenset()
    ranges: tuple[tuple[int, int], ...] = ()  # per IPv4 octet (lo, hi)

    def matches(self, ip: str) -> bool:
        if self.any:
            return True
        if not self.ranges and not self.addresses:  # blank: matches nothing
            return False
        addr = _normal(ip)
        if self.ranges:
            parts = addr.split(".")
            if len(parts) != 4 or not all(p.isdigit() for p in parts):
                return False
            return all(lo <= int(p) <= hi for p, (lo, hi) in zip(parts, self.ranges, strict=True))
        return addr in self.addresses


def compile_pattern(pattern: str | None) -> AddressPattern:
    """Parse one pattern; raises AddressPatternError on one RocketMQ would not accept either."""
    text = (pattern or "").strip()
    if not text:
        return AddressPattern(text)
    if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return AddressPattern(text, any=True)
    if text.endswith("}"):
        head, brace, items = text.rpartition("{")
        if not brace or not head or head[-1] not in ".:":
            raise AddressPatternError(f"address pattern {text!r}: a {{...}} list must be the last part")
        members = [m for m in items[:-1].split(",") if m.strip()]
        if not members:
            raise AddressPatternError(f"address pattern {text!r}: the {{...}} list is empty")
        return AddressPattern(text, addresses=frozenset(_address(head + m.strip(), text) for m in members))
    if "," in text:
        return AddressPattern(text, addresses=frozenset(_address(a, text) for a in text.split(",") if a.strip()))
    if "*" in text or "-" in text:
        if ":" in text:
            raise AddressPatternError(f"address pattern {text!r}: IPv6 wildcards and ranges are not supported")
        parts = text.split(".")
        if len(parts) != 4:
            raise AddressPatternError(f"address pattern {text!r}: an IPv4 pattern has 4 parts")
        ranges: list[tuple[int, int]] = []
        for i, part in enumerate(parts):
            part = part.strip()
            if part == "*" or "-" in part:
                if i == 0:
                    raise AddressPatternError(f"address pattern {text!r}: the first part cannot be a range")
                if part == "*":
                    lo, hi = 0, 255
                else:
                    first, _, last = part.partition("-")
                    lo, hi = _octet(first, text), _octet(last, text)
                    if lo > hi:
                        raise AddressPatternError(f"address pattern {text!r}: range {part!r} runs backwards")
                ranges.append((lo, hi))
                ranges += [(0, 255)] * (3 - i)  # RocketMQ ignores what follows the range
                break
            value = _octet(part, text)
            ranges.append((value, value))
        return AddressPattern(text, ranges=tuple(ranges))
    return AddressPattern(text, addresses=frozenset({_address(text, text)}))
