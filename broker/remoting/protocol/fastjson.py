"""JSON as RocketMQ's Java side (fastjson) writes and reads it (reference §7.5, pitfall 1).

Reading is lenient: fastjson writes ``Map<Integer, V>`` keys bare (``{0:"10.0.0.1:10911"}``) and, for a
``Map<MessageQueue, V>``, the key object itself (``{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}``).
Object keys are only looked for where a body is known to carry them (``object_keys=True``): the pattern is not
string-aware at the outer level.

Writing, always with compact separators as fastjson writes:
``dumps``: the broker's bodies, UTF-8 as is.
``dumps_standard``: BrowserCompatible — integer map keys quoted, non-ASCII escaped (the NameServer's bodies).
``dumps_legacy``: plain ``toJSONString`` — integer map keys bare, which old clients get for GET_ROUTEINFO_BY_TOPIC.
``dumps_mq_keyed``: a ``Map<MessageQueue, V>`` with JSON objects as keys (TopicStatsTable, ConsumeStats).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from store.config_files import load_lenient_json

_SEPARATORS = (",", ":")
# An object key: `{` or `,`, a JSON object (strings inside skipped whole), then `:`.
_OBJECT_KEY = re.compile(r'([{,]\s*)(\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\})(\s*:)')


def loads(text: str, source: str, *, object_keys: bool = False) -> Any:
    """Parse fastjson's JSON; object keys (with ``object_keys``) come back as their JSON text. Errors (a
    ``ConfigFileError``, a ValueError) name ``source``."""
    if object_keys:
        text = _OBJECT_KEY.sub(lambda m: m.group(1) + json.dumps(m.group(2)) + m.group(3), text)
    return load_lenient_json(text, source)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=_SEPARATORS, ensure_ascii=False).encode("utf-8")


def dumps_standard(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=True, separators=_SEPARATORS).encode()


def _legacy(obj: Any, out: list[str]) -> None:
    if isinstance(obj, dict):
        out.append("{")
        for i, (key, value) in enumerate(obj.items()):
            if i:
                out.append(",")
            is_int = isinstance(key, int) and not isinstance(key, bool)
            out.append(str(key) if is_int else json.dumps(str(key), ensure_ascii=False))
            out.append(":")
            _legacy(value, out)
        out.append("}")
    elif isinstance(obj, list | tuple):
        out.append("[")
        for i, value in enumerate(obj):
            if i:
                out.append(",")
            _legacy(value, out)
        out.append("]")
    else:
        out.append(json.dumps(obj, ensure_ascii=False))


def dumps_legacy(obj: Any) -> bytes:
    out: list[str] = []
    _legacy(obj, out)
    return "".join(out).encode()


def dumps_mq_keyed(items: Iterable[tuple[dict[str, Any], Any]]) -> str:
    """A ``Map<K, V>`` whose keys are objects (``items``: key and value, each JSON-ready), as fastjson writes it:
    not standard JSON, but what Java clients decode ``TopicStatsTable``/``ConsumeStats`` from."""
    pairs = (json.dumps(k, separators=_SEPARATORS) + ":" + json.dumps(v, separators=_SEPARATORS) for k, v in items)
    return "{" + ",".join(pairs) + "}"
