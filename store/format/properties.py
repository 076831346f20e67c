"""The properties string of a message (``MessageDecoder.messageProperties2String`` / ``string2messageProperties``)
and the property names the store and the broker read (``MessageConst``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from store.format import native

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"  # 5.x: a FIFO message's message group
PROPERTY_TRANSFER_FLAG = "TRANSFER_FLAG"  # 5.x: a message a proxy forwards on
PROPERTY_TRANSACTION_ID = "__transactionId__"  # a half message's transaction id (its UNIQ_KEY)
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"  # a retried message's original topic
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_SWITCH = "TRACE_ON"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"  # a re-put half's first queue offset
PROPERTY_CONSUME_START_TIME = "CONSUME_START_TIME"
# 5.x timer messages: what the client asks for, and what the broker adds when it parks and delivers one
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"


def encode_properties(props: Mapping[str, str | None]) -> bytes:
    """``messageProperties2String``: ``name 0x01 value 0x02`` per entry, null values skipped."""
    return "".join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items() if v is not None
    ).encode("utf-8")


def append_properties(props: bytes, values: Mapping[str, str | None]) -> bytes:
    """``props`` (a client's bytes, kept as they came) followed by ``values`` encoded, with a 0x02 between them
    when ``props`` does not end with one: Java 4.9.8's ``messageProperties2String`` leaves the last separator off,
    and without it the client's last value would run into the first appended name."""
    extra = encode_properties(values)
    if props and extra and not props.endswith(b"\x02"):
        return props + b"\x02" + extra
    return props + extra


def iter_properties(raw: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(name, value) byte pairs of a properties string, with ``string2messageProperties``'s quirks:
    a segment without 0x01, with an empty name or with an empty value is dropped."""
    for seg in raw.split(b"\x02"):
        name, sep, value = seg.partition(b"\x01")
        if sep and name and value:
            yield name, value


def property_value(raw: bytes, name: str) -> str | None:
    """One property's value without decoding them all; the last occurrence wins, as when Java fills its map, and
    an empty value counts as absent (``string2messageProperties`` drops it)."""
    return _value_after(raw, name.encode() + b"\x01")


def _value_after(raw: bytes, key: bytes) -> str | None:
    end = len(raw)
    while True:
        i = raw.rfind(key, 0, end)
        if i < 0:
            return None
        if i == 0 or raw[i - 1] == 0x02:
            j = raw.find(b"\x02", i)
            value = raw[i + len(key) : j if j >= 0 else len(raw)]
            return value.decode("utf-8", "replace") if value else None
        end = i


def decode_properties(data: bytes | bytearray | memoryview | str) -> dict[str, str]:
    """``string2messageProperties``."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return {n.decode("utf-8", "replace"): v.decode("utf-8", "replace") for n, v in iter_properties(raw)}


def split_keys(keys: str | None) -> list[str]:
    """The entries of a KEYS property (space-separated, empties dropped), each indexed on its own."""
    return [k for k in keys.split(KEY_SEPARATOR) if k] if keys else []


def property_finder(name: str) -> Callable[[bytes], str | None]:
    """``property_value`` for one name, its search key encoded once (a filter runs it on every record)."""
    key = name.encode() + b"\x01"
    return lambda raw: _value_after(raw, key)


# The compiled twin (store/format/_properties.pyx) replaces this when it is built; see store.format.native.
native.install(globals(), "store.format._properties", ("decode_properties",))
