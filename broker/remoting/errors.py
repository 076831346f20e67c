"""Errors of the remoting layer; each module re-exports the ones its callers catch."""

from __future__ import annotations


class FrameError(ValueError):
    """A frame that cannot be decoded (bad length, header length, serialize type or header text)."""


class HeaderError(ValueError):
    """A custom header with a required field missing or a value not parseable as the field's type."""


class RemotingError(Exception):
    """A call over the wire failed without a response."""


class RemotingConnectError(RemotingError):
    """The connection could not be opened, or it closed before the response arrived."""


class RemotingTimeoutError(RemotingError):
    """No response within the caller's timeout."""
