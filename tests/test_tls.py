"""TLS on the remoting ports (RocketMQ's ``tls.server.*`` keys): a real broker and NameServer on loopback, each
mode against plain and TLS clients, client certificates, a bad certificate path at start-up, and ``mqlake up``
with TLS enforced end to end (registration, routes, a send and a pull over TLS)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.client import Admin, Message, Producer, PullConsumer
from broker.client.errors import MQBrokerError, MQClientError
from broker.config import build_configs
from broker.namesrv import NamesrvController
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError
from broker.remoting.loop import run
from broker.remoting.tls import TlsConfigError, client_context
from broker.server.controller import BrokerController
from broker.tls_settings import tls_server_context
from cli.main import app
from tests.aio import async_test, poll
from tests.fixtures_broker import REPO, MqlakeServer, ready_port, stop_servers
from tests.helpers import wait_until
from tests.live_broker import SMALL, running_broker
from tests.tls_certs import self_signed

pytestmark = pytest.mark.integration



@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


@contextlib.asynccontextmanager
async def tls_broker(tmp_path: Path, certs: tuple[Path, Path], **tls: str) -> AsyncIterator[BrokerController]:
    cert, key = certs
    tls = {"tls.server.certPath": str(cert), "tls.server.keyPath": str(key), **tls}
    async with running_broker(tmp_path / "store", **tls) as controller:
        yield controller


async def runtime_info(addr: str, ssl_context=None) -> int:
    """The code of GET_BROKER_RUNTIME_INFO over a fresh channel; RemotingError when the channel fails."""
    client = RemotingClient(ssl_context=ssl_context, connect_timeout=5)
    try:
        return (await client.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 5)).code
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("mode", "plain_ok", "tls_ok"),
    [("enforcing", False, True), ("permissive", True, True), ("disabled", True, False)],
)
@async_test
async def test_each_server_mode_against_plain_and_tls_clients(
    tmp_path: Path, certs: tuple[Path, Path], mode: str, plain_ok: bool, tls_ok: bool
) -> None:
    async with tls_broker(tmp_path, certs, **{"tls.server.mode": mode}) as broker:
        for ssl_context, ok in ((None, plain_ok), (client_context(), tls_ok)):
            if ok:
                assert await runtime_info(broker.addr, ssl_context) == ResponseCode.SUCCESS
            else:
                with pytest.raises(RemotingError):
                    await runtime_info(broker.addr, ssl_context)
        # the refused client did not hurt the port: the accepted kind still gets in
        assert await runtime_info(broker.addr, client_context() if tls_ok else None) == ResponseCode.SUCCESS


@async_test
async def test_client_certificates_when_the_server_requires_them(tmp_path: Path, certs: tuple[Path, Path]) -> None:
    cert, key = certs
    async with tls_broker(tmp_path, certs, **{"tls.server.mode": "enforcing", "tls.server.need.client.auth": "require",
                                             "tls.server.trustCertPath": str(cert)}) as broker:  # fmt: skip
        with pytest.raises(RemotingError):
            await runtime_info(broker.addr, client_context())
        verified = client_context(trust=cert, verify_server=True, cert=cert, key=key)
        assert await runtime_info(broker.addr, verified) == ResponseCode.SUCCESS


@async_test
async def test_a_client_that_checks_the_server_refuses_an_untrusted_certificate(
    tmp_path: Path, certs: tuple[Path, Path]
) -> None:
    other_cert, _ = self_signed(tmp_path / "other")
    async with tls_broker(tmp_path, certs, **{"tls.server.mode": "enforcing"}) as broker:
        with pytest.raises(RemotingError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            await runtime_info(broker.addr, client_context(trust=other_cert, verify_server=True))


@async_test
async def test_namesrv_port_speaks_tls(certs: tuple[Path, Path]) -> None:
    cert, key = certs
    values = {"tls.server.mode": "enforcing", "tls.server.certPath": str(cert), "tls.server.keyPath": str(key)}
    tls = build_configs(values)[0].tls
    namesrv = NamesrvController("127.0.0.1", 0, tls_mode=tls.server_mode, ssl_context=tls_server_context(tls))
    await namesrv.start()
    try:
        for ssl_context, expected in ((client_context(), ResponseCode.SUCCESS), (None, None)):
            client = RemotingClient(ssl_context=ssl_context)
            try:
                cmd = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
                if expected is None:
                    with pytest.raises(RemotingError):
                        await client.invoke(namesrv.address, cmd, 5)
                else:
                    assert (await client.invoke(namesrv.address, cmd, 5)).code == expected
            finally:
                await client.close()
    finally:
        await namesrv.stop()


def test_unreadable_certificate_stops_start_up_naming_the_file(tmp_path: Path, certs: tuple[Path, Path]) -> None:
    _, key = certs
    missing = tmp_path / "no-such-cert.pem"
    values = {**SMALL, "listenPort": "0", "storePathRootDir": str(tmp_path / "store"), "tls.server.mode": "enforcing",
              "tls.server.certPath": str(missing), "tls.server.keyPath": str(key),
              "tls.server.keyPassword": "not-for-logs"}  # fmt: skip
    with pytest.raises(TlsConfigError, match="no-such-cert.pem") as err:
        BrokerController(*build_configs(values))
    assert "not-for-logs" not in str(err.value)


def test_mqlake_up_enforcing_tls_end_to_end(tmp_path: Path, certs: tuple[Path, Path]) -> None:
    cert, key = certs
    server = MqlakeServer(tmp_path / "up", **{"tls.server.mode": "enforcing", "tls.server.certPath": str(cert),
                                              "tls.server.keyPath": str(key)})  # fmt: skip
    server.start()  # ready only once the broker registered with its NameServer, over TLS
    try:
        async def go() -> None:
            tls = client_context(trust=cert, verify_server=True)
            async with Producer("tls_pg", server.namesrv_addr, ssl_context=tls) as p:
                sent = await p.send(Message("TlsTopic", "over tls"))
            async with PullConsumer("tls_cg", server.namesrv_addr, ssl_context=tls) as c:

                async def pulled() -> list[bytes] | None:
                    try:
                        result = await c.pull(sent.queue, sent.queue_offset, 1)
                    except MQBrokerError:
                        raise
                    except MQClientError:  # the auto-created topic's route is not on the NameServer yet
                        return None
                    return [m.body for m in result.messages]

                assert await poll(pulled, timeout=10, what="the message over TLS", interval=0.05) == [b"over tls"]
            async with Admin(server.namesrv_addr, timeout=3) as plain:  # a plain client is dropped
                with pytest.raises(MQClientError, match="no NameServer of .* answered"):
                    await plain.cluster_info()

        run(go())
        listed = CliRunner().invoke(app, ["admin", "--tls-trust", str(cert), "clusterList", "-n", server.namesrv_addr,
                                          "--json"])  # fmt: skip
        assert listed.exit_code == 0, listed.output
        assert [b["addr"] for b in json.loads(listed.stdout)] == [server.broker_addr]
        plain = CliRunner().invoke(app, ["admin", "clusterList", "-n", server.namesrv_addr])
        assert plain.exit_code == 1 and "no NameServer" in plain.output
    finally:
        stop_servers([server])


def test_mqlake_namesrv_reads_tls_keys_from_its_config(tmp_path: Path, certs: tuple[Path, Path]) -> None:
    cert, key = certs
    conf = tmp_path / "namesrv.properties"
    conf.write_text(f"tls.server.mode=permissive\ntls.server.certPath={cert}\ntls.server.keyPath={key}\n"
                    "listenPort=9876\n")  # fmt: skip
    log = tmp_path / "namesrv.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "namesrv", "--port", "0", "-c", str(conf)],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    try:
        wait_until(lambda: "NameServer ready" in log.read_text() or proc.poll() is not None, 30,
                   what="mqlake namesrv to start")  # fmt: skip
        assert proc.poll() is None, log.read_text()
        assert "unknown key 'listenPort' ignored" in log.read_text()
        port = ready_port(log.read_text(), "NameServer")  # the OS's pick

        async def both() -> list[int]:
            codes = []
            for ssl_context in (None, client_context()):  # permissive: plain and TLS on one port
                client = RemotingClient(ssl_context=ssl_context)
                try:
                    cmd = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
                    codes.append((await client.invoke(f"127.0.0.1:{port}", cmd, 5)).code)
                finally:
                    await client.close()
            return codes

        assert run(both()) == [ResponseCode.SUCCESS, ResponseCode.SUCCESS]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
