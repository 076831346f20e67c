"""Client exceptions: a broker/NameServer answered with an error code, or the client could not proceed."""

from __future__ import annotations

from store.errors import MQLakeError


class MQClientError(MQLakeError):
    """The client could not do what was asked (no route, no broker address, not started, ...)."""


class MessageError(MQClientError, ValueError):
    """A message the client will not send as it is (a property it sets itself, or one it cannot encode)."""


class MQBrokerError(MQClientError):
    """A broker or NameServer answered with a non-success response code (``MQBrokerException``)."""

    def __init__(self, code: int, remark: str | None, addr: str = "", what: str = "") -> None:
        self.code = code
        self.remark = remark
        self.addr = addr
        name = _code_name(code)
        where = f" from {addr}" if addr else ""
        prefix = f"{what}: " if what else ""
        super().__init__(f"{prefix}code {code} ({name}){where}: {remark or ''}".rstrip(": "))


def _code_name(code: int) -> str:
    from broker.remoting.codes import ResponseCode

    try:
        return ResponseCode(code).name
    except ValueError:
        return "UNKNOWN"
