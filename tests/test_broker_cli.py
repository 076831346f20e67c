"""``mqlake broker`` and ``mqlake up`` as processes: registration with NameServers, graceful SIGTERM, defaults,
and start-up errors a user can act on."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import known_keys, load_broker_conf
from broker.embedded import ready_address
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from store.checkpoint import abort_file
from store.config_files import load_lenient_json
from tests.fixtures_broker import TEST_CONF, ready_port
from tests.fixtures_broker import remoting_call as broker_call
from tests.helpers import wait_until
from tests.peers import lib

pytestmark = pytest.mark.integration

MQLAKE = [sys.executable, "-P", "-c", "from cli.main import main; main()"]


def _write_conf(path: Path, **values: str) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def _cluster(namesrv_addr: str) -> dict:
    r = broker_call(namesrv_addr, RequestCode.GET_BROKER_CLUSTER_INFO)
    assert r.code == ResponseCode.SUCCESS, r.remark
    return load_lenient_json(r.body.decode(), "cluster info")


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_broker_registers_with_the_name_server_and_unregisters_on_sigterm(mqlake_server, tmp_path: Path) -> None:
    store = tmp_path / "b-store"
    down = socket.socket()  # bound, never listening: a NameServer address that refuses, and stays ours
    down.bind(("127.0.0.1", 0))
    conf = _write_conf(
        tmp_path / "broker.conf",
        **{**TEST_CONF, "brokerName": "broker-b", "brokerClusterName": "OtherCluster", "listenPort": "0",
           "namesrvAddr": f"{mqlake_server.namesrv_addr};127.0.0.1:{down.getsockname()[1]}",  # one of two is down
           "storePathRootDir": str(store)},
    )  # fmt: skip
    log = tmp_path / "broker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*MQLAKE, "broker", "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT,
                                cwd=tmp_path)  # fmt: skip
    try:
        wait_until(lambda: "Broker ready at" in _log(log) or proc.poll() is not None, 60, what="mqlake broker")
        assert proc.poll() is None, _log(log)
        port = ready_port(_log(log), "Broker")  # the OS's pick
        info = _cluster(mqlake_server.namesrv_addr)
        assert info["clusterAddrTable"]["OtherCluster"] == ["broker-b"]
        assert list(info["brokerAddrTable"]["broker-b"]["brokerAddrs"].values()) == [f"127.0.0.1:{port}"]
        route = broker_call(mqlake_server.namesrv_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                            h.GetRouteInfoRequestHeader(topic="OtherCluster"))  # fmt: skip
        assert route.code == ResponseCode.SUCCESS  # the cluster-name topic a broker creates for itself
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, _log(log)
    finally:
        down.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "broker-b" not in _cluster(mqlake_server.namesrv_addr)["brokerAddrTable"]
    assert not abort_file(store).exists()  # a clean shutdown


def test_up_defaults_to_a_store_under_the_working_directory(tmp_path: Path) -> None:
    conf = _write_conf(tmp_path / "small.conf", **TEST_CONF)  # small files; no storePathRootDir
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*MQLAKE, "up", "-c", str(conf), "--namesrv-port", "0", "--broker-port", "0"],  # the OS picks both
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
    try:
        wait_until(lambda: "Broker ready at" in _log(log) or proc.poll() is not None, 60, what="mqlake up")
        text = _log(log)
        ns_addr, b_addr = ready_address(text, "NameServer"), ready_address(text, "Broker")
        assert ns_addr is not None and b_addr is not None, text
        ns_host, _, ns_port = ns_addr.rpartition(":")
        b_host, _, b_port = b_addr.rpartition(":")
        assert ns_host == b_host == "127.0.0.1" and int(ns_port) and int(b_port) and ns_port != b_port
        # the broker registered with the NameServer's real port, not with port 0
        assert _cluster(f"127.0.0.1:{ns_port}")["clusterAddrTable"]["DefaultCluster"] == ["broker-a"]
        assert (tmp_path / ".mqlake" / "store" / "commitlog").is_dir()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, _log(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_misspelled_durability_key_stops_start_up_with_one_line(tmp_path: Path) -> None:
    """``flushDiskTyp=SYNC_FLUSH`` would leave the broker on ASYNC_FLUSH: nothing starts, and the one error line
    names the key and what it resembles; nothing is created in the store dir."""
    conf = _write_conf(tmp_path / "typo.conf", flushDiskTyp="SYNC_FLUSH", storePathRootDir=str(tmp_path / "s"))
    out = subprocess.run([*MQLAKE, "up", "-c", str(conf)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(errors) == 1 and "'flushDiskTyp'" in errors[0] and "'flushDiskType'" in errors[0], out.stderr
    assert "strictConfig=false" in errors[0] and "Traceback" not in out.stdout + out.stderr
    assert not (tmp_path / "s").exists()


def _java_config_keys(jar: Path, cls: str) -> set[str]:
    """The settings of one of Apache RocketMQ's config classes, read off its jar: its instance fields (what
    ``MixAll.properties2Object`` sets from broker.conf) and its ``tls.*`` key constants."""
    out = subprocess.run(["javap", "-p", "-constants", "-cp", str(jar), cls], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    keys = set()
    for line in out.splitlines():
        words = line.strip().rstrip(";").split()
        if len(words) == 3 and words[0] == "private":  # private <type> <name>: not static, not final
            keys.add(words[2])
        keys.update(w.strip('"') for w in words if w.startswith('"tls.'))
    return keys


def test_no_key_of_apache_rocketmq_stops_start_up(tmp_path: Path) -> None:
    """A broker.conf written for Apache RocketMQ 4.9.7 or 5.4.0 may hold any of its keys: the ones mqlake does not
    know only warn, even where one resembles a durability or security key of mqlake's."""
    classes = [
        (lib("rocketmq-4-broker"), "rocketmq-store-4.9.7.jar", "org.apache.rocketmq.store.config.MessageStoreConfig"),
        (lib("rocketmq-4-broker"), "rocketmq-common-4.9.7.jar", "org.apache.rocketmq.common.BrokerConfig"),
        (lib("rocketmq-5"), "rocketmq-store-5.4.0.jar", "org.apache.rocketmq.store.config.MessageStoreConfig"),
        (lib("rocketmq-5"), "rocketmq-common-5.4.0.jar", "org.apache.rocketmq.common.BrokerConfig"),
        (lib("rocketmq-5"), "rocketmq-remoting-5.4.0.jar", "org.apache.rocketmq.remoting.netty.TlsSystemConfig"),
    ]
    keys = set().union(*(_java_config_keys(folder / jar, cls) for folder, jar, cls in classes))
    unknown = sorted(keys - known_keys())
    assert len(keys) > 400 and len(unknown) > 100  # the jars were read
    conf = _write_conf(tmp_path / "rocketmq.conf", **dict.fromkeys(unknown, "x"))
    load_broker_conf(conf)  # warnings only


def test_bad_config_and_busy_port_fail_with_one_clear_line(tmp_path: Path) -> None:
    bad = _write_conf(tmp_path / "bad.conf", listenPort="ten")
    out = subprocess.run([*MQLAKE, "up", "-c", str(bad)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2 and "listenPort" in out.stderr and "Traceback" not in out.stdout + out.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        conf = _write_conf(tmp_path / "ok.conf", **TEST_CONF, storePathRootDir=str(tmp_path / "s"))
        out = subprocess.run([*MQLAKE, "up", "-c", str(conf), "--namesrv-port", str(port)], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 1 and f":{port} is already in use" in out.stderr, out.stdout + out.stderr
    assert "--namesrv-port" in out.stderr  # the setting to change
    assert "Traceback" not in out.stdout + out.stderr
