"""Broker fixtures: a real ``mqlake up`` (NameServer + Broker) as a subprocess on loopback ports the OS picks.

Fixtures (registered as a pytest plugin by tests/conftest.py):

- ``mqlake_server`` (session scope): one running server shared by every test that asks for it. Use unique
  topic and group names per test; do not stop or restart it.
- ``mqlake_server_factory`` (function scope): ``mqlake_server_factory(**conf)`` starts a fresh server with
  its own store; ``conf`` adds or overrides broker.conf keys (RocketMQ names, e.g.
  ``flushDiskType="SYNC_FLUSH"``). Every server it started is stopped when the test ends.

Both yield :class:`MqlakeServer` objects:

- ``namesrv_addr`` / ``broker_addr`` ("127.0.0.1:port"), ``store_dir`` (Path), ``conf_path``, ``log_path``;
- ``process`` (the ``subprocess.Popen``), ``stop()`` (SIGTERM, waits for the graceful exit and returns
  the exit code, 0; it fails the test when the server ignores SIGTERM, exits with another code or logs an
  error while shutting down), ``kill()`` (SIGKILL), ``restart(graceful=True)`` (same ports and store),
  ``log_text()``.

At the end of a test the fixtures stop their servers the same way, and a server that exited on its own during
the test (crashed) fails it too: ``stop_servers(servers)`` does that for a fixture of a test module's own. An
ERROR line or a traceback a server logs while a test runs fails that test (tests/harness.py), unless the test
declares it with ``@pytest.mark.expected_errors``.

The ports (``namesrv_port``, ``broker_port``, the broker's HA port, and with a proxy or a Prometheus exporter
``grpc_endpoint`` and ``metrics_port``) are the OS's picks at the first start, read off the lines reporting them and
kept in broker.conf, so the addresses are known once the server has started and a restart serves the same ones.

``remoting_call(addr, code, header, body)`` sends one request with mqlake's RemotingClient and returns the
response, for asserting on a server's state from outside (offsets, consumer lists, routes).
``count_topic(namesrv, topic)`` and ``read_topic(namesrv, topic, expect)`` count and read back a topic with
mqlake's client (the read waits until ``expect`` messages are consumable); ``read_queue(consumer, mq)`` reads
one queue.

Readiness is the server's own "Broker ready at" log line (printed after the broker has registered with
its NameServer), polled with a deadline; a server that exits early raises with its log attached. A server
gets SIGTERM when the test process dies (PR_SET_PDEATHSIG), so a killed test run leaves no server behind.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from broker.client import Admin, MessageExt, MessageQueue, PullConsumer
from broker.client.message import PullStatus
from broker.embedded import ready_address
from broker.remoting.client import RemotingClient
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import Header
from broker.remoting.loop import run
from broker.remoting.signing import Credentials
from tests import harness, host_disk
from tests.helpers import wait_until

START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0

# Small files keep a test store cheap: the store pre-fills each next CommitLog segment on disk.
TEST_CONF = {
    "brokerClusterName": "DefaultCluster",
    "brokerName": "broker-a",
    "brokerIP1": "127.0.0.1",
    "mappedFileSizeCommitLog": str(8 * 1024 * 1024),
    "mappedFileSizeConsumeQueue": str(20 * 10_000),
    "maxHashSlotNum": "10000",
    "maxIndexNum": "40000",
    "flushDiskType": "ASYNC_FLUSH",
    # RocketMQ's setting, shortened: a consumer's retry (delay level 3 + reconsumeTimes, clamped) waits 1 s, not 10 s
    "messageDelayLevel": "1s",
}

REPO = Path(__file__).resolve().parents[1]


def remoting_call(addr: str, code: int, header: Header | None = None, body: bytes = b"",
                  ssl_context=None, credentials: Credentials | None = None) -> RemotingCommand:  # fmt: skip
    """One request over mqlake's own remoting client, to observe a server's state from outside a test (over TLS
    with ``ssl_context``; signed with ``credentials`` for a broker with aclEnable)."""

    async def call() -> RemotingCommand:
        client = RemotingClient(ssl_context=ssl_context, rpc_hook=credentials.sign if credentials else None)
        try:
            return await client.invoke(addr, RemotingCommand.request(code, header, body), 10)
        finally:
            await client.close()

    return asyncio.run(call())


_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: a test run that is killed outright (SIGKILL, a CI timeout)
    # must not leave servers holding ports; the child gets SIGTERM when the test process dies.
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def ready_port(log_text: str, server: str) -> int:
    """The port of ``server``'s ready line in a log (``broker.embedded.ready_address``), which must have one."""
    addr = ready_address(log_text, server)
    assert addr is not None, f"no '{server} ready at host:port' line in:\n{log_text[-4000:]}"
    return int(addr.rpartition(":")[2])


FIRST_PICKED_PORT = 20000  # above the servers' well-known defaults (9876, 10909-10912, 8081)


def unassigned_port(*offsets: int) -> int:
    """A port p, with p + each of ``offsets``, free on 127.0.0.1 and below the kernel's ephemeral range
    (``ip_local_port_range``), for a server that must be told its port before it starts (a Java broker binds two
    more derived from it; controller peers name each other). A port 0 bind and an outgoing connection take ports
    from the ephemeral range only, so nothing but another such pick can take these between this check (all bound
    together) and the server's bind; the pick is random, so two workers' picks rarely meet."""
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    spread = (min((0, *offsets)), max((0, *offsets)))
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randrange(FIRST_PICKED_PORT - spread[0], first_ephemeral - spread[1])
        held: list[socket.socket] = []
        try:
            for p in sorted({port, *(port + o for o in offsets)}):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError(f"no free port below {first_ephemeral} with {offsets} beside it on 127.0.0.1")


class MqlakeServer:
    """One ``mqlake up`` process; its ports and store survive ``restart``."""

    def __init__(self, work_dir: Path, command: str = "up", *, real_disk: bool = False, **conf: str) -> None:
        self.command = command  # "up" (NameServer + Broker), "broker" (namesrvAddr's NameServer) or "namesrv"
        self.real_disk = real_disk  # the store reads its disk's real usage, not the suite's half-full figure
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # 0: the OS picks every port at the first start (no port chosen here can be taken by another process before
        # the server binds it); the ports are read off the ready lines and kept for restarts.
        self.namesrv_port = 0
        self.broker_port = 0
        self.store_dir = self.work_dir / "store"
        self.conf_path = self.work_dir / "broker.conf"
        self.log_path = self.work_dir / "mqlake.log"
        self.values = {
            **TEST_CONF,
            "storePathRootDir": str(self.store_dir),
            "listenPort": "0",  # the broker's HA port too is then the OS's pick (unless haListenPort says)
            "grpcServerPort": "0",  # with enableProxy
            "metricsPromExporterPort": "0",  # with metricsExporterType=PROM
            **{k: str(v) for k, v in conf.items()},
        }
        if "listenPort" in conf:
            self.broker_port = int(conf["listenPort"])
        # a NameServer alone reads only its own keys (-c namesrv.conf): those given here, e.g. its embedded controller's
        self.namesrv_values = {k: str(v) for k, v in conf.items()} if command == "namesrv" else {}
        self.controller_addr: str | None = None  # the embedded controller's (enableControllerInNamesrv)
        self._write_conf()
        self.process: subprocess.Popen | None = None
        self._log_offset = 0
        self._checked_offset = 0  # how far tests/harness.py has read the log for errors
        self.name = f"mqlake {command} ({self.work_dir.name})"
        self._ended_by_test = False  # stop() or kill() ended the current process

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def namesrv_addr(self) -> str:
        assert self.namesrv_port, "the NameServer's port is known once the server has started"
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        assert self.broker_port, "the broker's port is known once the server has started"
        return f"127.0.0.1:{self.broker_port}"

    def _write_conf(self) -> None:
        self.conf_path.write_text("".join(f"{k}={v}\n" for k, v in self.values.items()), encoding="latin-1")
        if self.namesrv_values:
            text = "".join(f"{k}={v}\n" for k, v in self.namesrv_values.items())
            (self.work_dir / "namesrv.conf").write_text(text, encoding="latin-1")

    # the broker's other listeners, on port 0 unless a test names one: the line reporting the OS's pick
    _REPORTED_PORTS = {
        "grpcServerPort": r"gRPC proxy ready at [\d.]+:(\d+)",
        "metricsPromExporterPort": r"Prometheus metrics on http://[^:/]+:(\d+)/",
    }

    @property
    def grpc_endpoint(self) -> str:
        """The gRPC proxy's "127.0.0.1:port" (enableProxy), the OS's pick at the first start."""
        assert self.values["grpcServerPort"] != "0", "the gRPC port is known once a server with a proxy has started"
        return f"127.0.0.1:{self.values['grpcServerPort']}"

    @property
    def metrics_port(self) -> int:
        """The Prometheus exporter's port (metricsExporterType=PROM), the OS's pick at the first start."""
        assert self.values["metricsPromExporterPort"] != "0", "the metrics port is known once the server has started"
        return int(self.values["metricsPromExporterPort"])

    def _learn_ports(self) -> None:
        """Keep the ports the OS picked at the first start, so a restart serves the same addresses."""
        log = self.run_log()
        if self.command in ("up", "namesrv") and not self.namesrv_port:
            self.namesrv_port = ready_port(log, "NameServer")
        controller = ready_address(log, "Controller")
        if controller is not None and self.controller_addr is None:
            self.controller_addr = controller
            self.namesrv_values["controllerListenPort"] = controller.rpartition(":")[2]  # the same port after a restart
            self._write_conf()
        if self.command != "namesrv" and not self.broker_port:
            self.broker_port = ready_port(log, "Broker")
            self.values["listenPort"] = str(self.broker_port)
            ha = re.search(r"HA service listening on [\d.]+:(\d+)", log)
            if ha is not None and "haListenPort" not in self.values:
                self.values["haListenPort"] = ha.group(1)
            for key, line in self._REPORTED_PORTS.items():
                if self.values[key] == "0" and (found := re.search(line, log)) is not None:
                    self.values[key] = found.group(1)
            self._write_conf()

    def new_log_lines(self) -> list[str]:
        """The log's complete lines since the last call (tests/harness.py fails the running test on an error)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._checked_offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._checked_offset += len(complete)
        return complete.decode("utf-8", errors="replace").splitlines()

    def start(self) -> MqlakeServer:
        assert self.process is None or self.process.poll() is not None, "already running"
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        harness.watch(self)
        self._ended_by_test = False
        # -P: the work dir (the cwd) holds a "store" directory that must not shadow the store package
        pin = "" if self.real_disk else host_disk.PIN
        cmd = [sys.executable, "-P", "-c", pin + "from cli.main import main; main()", self.command]
        if self.command == "namesrv":
            cmd += ["--port", str(self.namesrv_port)]
            if self.namesrv_values:
                cmd += ["-c", str(self.work_dir / "namesrv.conf")]
        else:
            cmd += ["-c", str(self.conf_path)]
        if self.command == "up":
            cmd += ["--namesrv-port", str(self.namesrv_port)]
        cmd += ["--log-level", "INFO"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.work_dir, env=env, start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        wait_until(self._ready, START_TIMEOUT, what=f"{self.name} to be ready")
        self._learn_ports()
        return self

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"mqlake up exited with {self.process.returncode}:\n{self.log_text()[-4000:]}")
        return ready_address(self.run_log(), "NameServer" if self.command == "namesrv" else "Broker") is not None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def run_log(self) -> str:
        """The log of the current (or last) process, since its start."""
        return self.log_text()[self._log_offset :]

    def stop(self) -> int | None:
        """SIGTERM and wait for the graceful shutdown; returns the exit code, 0 (None if it was not running).

        A shutdown that hangs (SIGTERM ignored for STOP_TIMEOUT s: the process is then killed), exits with another
        code, or logs an error or a traceback raises AssertionError with the log's tail."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self._ended_by_test = True
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"mqlake up ignored SIGTERM for {STOP_TIMEOUT}s:\n{self.run_log()[-4000:]}"
                ) from None
            # the graceful path logs "shutting down" once the signal is handled; what it logs after is the shutdown
            _, began, shutdown = self.run_log().partition("mqlake: shutting down")
            if self.command == "namesrv":  # a NameServer alone logs nothing on the way out
                began, shutdown = "-", ""
            errors = [line for line in shutdown.splitlines() if " ERROR " in line or " CRITICAL " in line]
            if self.process.returncode != 0 or not began or errors or "Traceback" in shutdown:
                raise AssertionError(
                    f"mqlake up did not shut down cleanly (exit code {self.process.returncode}):\n"
                    f"{self.run_log()[-4000:]}"
                )
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL: no shutdown at all, as after a crash."""
        if self.process is not None and self.process.poll() is None:
            self._ended_by_test = True
            self.process.kill()
            self.process.wait()

    def finish(self) -> str | None:
        """End of a test: stop the server if it runs; what went wrong (a bad shutdown, or an exit the test did not
        ask for), or None. The process is gone afterwards in every case."""
        try:
            if self.running:
                self.stop()
            elif self.process is not None and not self._ended_by_test:
                return f"mqlake up exited with {self.process.returncode} during the test:\n{self.run_log()[-4000:]}"
        except AssertionError as e:
            return str(e)
        finally:
            self.kill()
        return None

    def restart(self, graceful: bool = True) -> MqlakeServer:
        if graceful:
            self.stop()
        else:
            self.kill()
        return self.start()


def stop_servers(servers: list[MqlakeServer]) -> None:
    """Stop every server (see :meth:`MqlakeServer.finish`), then fail naming each one that went wrong."""
    problems = [p for p in (server.finish() for server in servers) if p is not None]
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def mqlake_server(tmp_path_factory):
    """A shared running ``mqlake up`` (session scope)."""
    server = MqlakeServer(tmp_path_factory.mktemp("mqlake-session")).start()
    yield server
    stop_servers([server])


@pytest.fixture
def mqlake_server_factory(tmp_path):
    """``factory(**conf)`` -> a fresh started ``mqlake up`` with its own store; all stopped at test end."""
    servers: list[MqlakeServer] = []

    def factory(**conf: str) -> MqlakeServer:
        server = MqlakeServer(tmp_path / f"mqlake-{len(servers)}", **conf)
        servers.append(server)
        return server.start()

    yield factory
    stop_servers(servers)


def count_topic(namesrv: str, topic: str) -> int:
    """Messages in ``topic`` (0 while it does not exist yet: the replay being watched creates it)."""

    async def go() -> int:
        async with Admin(namesrv) as admin:
            if await admin.topic_route(topic) is None:
                return 0
            return sum(s.max_offset - s.min_offset for s in await admin.topic_status(topic))

    return run(go())


def read_topic(namesrv: str, topic: str, expect: int) -> dict[int, list[MessageExt]]:
    """Every message of every queue of ``topic``, in queue order, with our PullConsumer, once ``expect`` of them
    are consumable: a send is acknowledged when the CommitLog holds it and the broker's dispatch makes it
    consumable a moment later (as in RocketMQ), so reading right after a replay can miss its last sends."""
    wait_until(lambda: count_topic(namesrv, topic) >= expect, 30, what=f"{expect} messages of {topic} dispatched")

    async def go():
        async with PullConsumer("replay_test_reader", namesrv) as c:
            return {mq.queue_id: await read_queue(c, mq) for mq in await c.fetch_queues(topic)}

    return run(go())


async def read_queue(c: PullConsumer, mq: MessageQueue, start: int | None = None) -> list[MessageExt]:
    """Every message of ``mq`` from ``start`` (default its min offset) to its max offset."""
    offset = await c.min_offset(mq) if start is None else start
    end = await c.max_offset(mq)
    got: list[MessageExt] = []
    while offset < end:
        res = await c.pull(mq, offset, 32)
        assert res.status is PullStatus.FOUND, (mq, offset, res.status)
        got.extend(res.messages)
        offset = res.next_begin_offset
    return got
