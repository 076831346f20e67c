"""The two JSON dialects a RocketMQ name server writes (reference §7.5, pitfall 1).

``standard``: what fastjson writes with BrowserCompatible — integer map keys quoted, non-ASCII escaped.
``legacy``: plain ``toJSONString`` — integer map keys bare (``{0:"10.0.0.1:10911"}``), which old clients get
for GET_ROUTEINFO_BY_TOPIC. Both with compact separators, as fastjson writes.
"""

from __future__ import annotations

import json
from typing import Any

_SEPARATORS = (",", ":")


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
