"""Errors of the remoting layer; each module re-exports the ones its callers catch."""

from __future__ import annotations

import errno

from store.errors import MQLakeError


class FrameError(MQLakeError, ValueError):
    """A frame that cannot be decoded (bad length, header length, serialize type or header text)."""


class HeaderError(MQLakeError, ValueError):
    """A custom header with a required field missing or a value not parseable as the field's type."""


class BodyError(MQLakeError, ValueError):
    """A request or response body that is not JSON, or not the JSON its model needs; the message names the body
    and the field (``topicConfigSerializeWrapper.topicConfigTable['T'].readQueueNums: ...``)."""


class RequestRefused(MQLakeError):
    """A request answered with an error ``code`` and ``remark`` (RocketMQ's response, not a failure of ours).

    A handler may raise it anywhere: the remoting layer answers it with its code and remark."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


class RemotingError(MQLakeError):
    """A call over the wire failed without a response."""


class RemotingConnectError(RemotingError):
    """The connection could not be opened, or it closed before the response arrived."""


class RemotingTimeoutError(RemotingError):
    """No response within the caller's timeout."""


class PortInUseError(MQLakeError, OSError):
    """A server could not listen: its port is taken (EADDRINUSE). The message names the setting to change."""

    def __str__(self) -> str:  # the sentence alone: OSError's own form starts with "[Errno 98]"
        return str(self.strerror)


def port_in_use(e: OSError, host: str, port: int, setting: str) -> OSError:
    """``e`` as a :class:`PortInUseError` naming ``setting`` when the port was taken; any other error as it is."""
    if e.errno != errno.EADDRINUSE:
        return e
    return PortInUseError(errno.EADDRINUSE, f"{host}:{port} is already in use by another process: set {setting} to a "
                          "free port")  # fmt: skip
