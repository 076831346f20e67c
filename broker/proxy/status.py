"""The v2 status codes a request is answered with, and the one error the proxy raises for them."""

from __future__ import annotations

from broker.proxy.v2 import definition_pb2 as pb
from broker.remoting.codes import ResponseCode
from store.errors import MQLakeError

Code = pb.Code

# A remoting response code from a broker processor, as the v2 status it becomes (the proxy's ResponseCode mapping).
_FROM_REMOTING: dict[int, int] = {
    ResponseCode.SUCCESS: pb.OK,
    ResponseCode.MESSAGE_ILLEGAL: pb.BAD_REQUEST,
    ResponseCode.NO_PERMISSION: pb.FORBIDDEN,
    ResponseCode.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pb.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.FLUSH_DISK_TIMEOUT: pb.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: pb.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: pb.HA_NOT_AVAILABLE,
    ResponseCode.SERVICE_NOT_AVAILABLE: pb.INTERNAL_SERVER_ERROR,
    ResponseCode.ILLEGAL_OPERATION: pb.BAD_REQUEST,
}


class ProxyError(MQLakeError):
    """A request the proxy refuses: answered with ``code`` (a v2 ``Code``) and this message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status(code: int = pb.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)  # type: ignore[arg-type]


def from_remoting(code: int) -> int:
    return _FROM_REMOTING.get(code, pb.INTERNAL_SERVER_ERROR)
