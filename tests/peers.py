"""Apache RocketMQ itself, run beside mqlake: its jars (``make peers``), Java programs compiled against them, and
its NameServer, broker and proxy as processes on loopback.

The jars are pinned by ``tools/peers/<name>/pom.xml`` and fetched with their dependencies into
``.peers/<name>/lib``:

- ``rocketmq-4``: the 4.9.8 client, ACL hook and tools (mqadmin);
- ``rocketmq-4-broker``: the 4.9.7 NameServer and broker (no 4.9.8 broker jar is served by Maven Central);
- ``rocketmq-5``: 5.4.0 NameServer, broker, proxy, controller and tools;
- ``client-java-5``: the 5.x gRPC client ``rocketmq-client-java`` 5.2.0.

A missing jar or JDK fails the test that needs it (``AssertionError`` naming ``make peers``): on this project's
machines they are always there, so a skip would hide a broken install.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from broker.client import Admin
from broker.remoting.codes import RequestCode
from broker.remoting.loop import run
from store.retention import disk_used_ratio
from tests.fixtures_broker import _die_with_parent, remoting_call, unassigned_port
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / ".peers"
JAVA_SOURCES = Path(__file__).with_name("java")  # the Java programs the tests compile against the peers' jars

# A JVM on a 2-core test machine: a small heap and a GC that does not size itself for a server. RocketMQ 4.x
# unmaps its files through JDK internals, which JDK 17 opens only on request (without them its shutdown hook fails
# and leaves `abort` behind).
JVM_OPTS = ("-Xms64m", "-Xmx384m", "-XX:MaxDirectMemorySize=256m", "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true",
            "--add-opens=java.base/java.nio=ALL-UNNAMED", "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
            "--add-opens=java.base/java.lang=ALL-UNNAMED", "--add-opens=java.base/java.util=ALL-UNNAMED",
            "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED",
            "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED")  # fmt: skip
START_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0


def lib(name: str) -> Path:
    """``.peers/<name>/lib``, or AssertionError naming the command that fetches it."""
    path = PEERS / name / "lib"
    if not (PEERS / name / ".fetched").exists() or not any(path.glob("*.jar")):
        raise AssertionError(f"{path} is missing: run `make peers` (JDK 17 and Maven fetch Apache RocketMQ's jars)")
    for tool in ("java", "javac"):
        if shutil.which(tool) is None:
            raise AssertionError(f"no `{tool}` on PATH: the tests run Apache RocketMQ's jars with a JDK 17")
    return path


def classpath(*names: str, extra: tuple[Path, ...] = ()) -> str:
    return os.pathsep.join([*(str(p) for p in extra), *(f"{lib(n)}/*" for n in names)])


def compile_java(sources: list[Path], peer: str, out_root: Path) -> Path:
    """Compile ``sources`` against ``peer``'s jars into a directory keyed by their content (reused while they are
    unchanged, so a module's tests compile once); returns the class directory."""
    digest = hashlib.sha256(peer.encode())
    for src in sorted(sources):
        digest.update(src.name.encode() + b"\0" + src.read_bytes())
    out = out_root / f"{peer}-{digest.hexdigest()[:16]}"
    if not (out / ".compiled").exists():
        out.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["javac", "-nowarn", "-encoding", "UTF-8", "-cp", classpath(peer), "-d", str(out),
                               *map(str, sources)], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, f"javac failed:\n{proc.stderr[-6000:]}"
        (out / ".compiled").touch()
    return out


def java(main: str, peer: str, *args: str, classes: Path | None = None, home: Path, timeout: float = 300.0,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``main`` on ``peer``'s jars (and ``classes``), ``home`` as user.home (where RocketMQ's clients log) and
    ROCKETMQ_HOME (where mqadmin reads ``conf/logback_tools.xml``)."""
    home.mkdir(parents=True, exist_ok=True)
    cmd = ["java", *JVM_OPTS, f"-Duser.home={home}",
           "-cp", classpath(peer, extra=(classes,) if classes else ()), main, *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=home,
                          env={**os.environ, "ROCKETMQ_HOME": str(home), **(env or {})})  # fmt: skip


_LOGBACK = """<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <encoder><pattern>%d{{HH:mm:ss.SSS}} %-5p %c{{1}} - %m%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""


class JavaServer:
    """One Apache RocketMQ server process (NameServer, broker, or proxy with its broker in local mode).

    ``home`` is its ROCKETMQ_HOME and user.home: its logback configuration (4.x reads ``conf/logback_*.xml``; 5.x
    logs under ``user.home/logs``), its config files and its logs all stay there."""

    READY = {"namesrv": "boot success", "broker": "boot success", "proxy": "startup successfully",
             "controller": "Controller Server boot success"}  # fmt: skip
    MAIN = {
        "namesrv": "org.apache.rocketmq.namesrv.NamesrvStartup",
        "broker": "org.apache.rocketmq.broker.BrokerStartup",
        "proxy": "org.apache.rocketmq.proxy.ProxyStartup",
        "controller": "org.apache.rocketmq.controller.ControllerStartup",
    }

    def __init__(self, kind: str, peer: str, home: Path, *args: str, jvm_opts: tuple[str, ...] = JVM_OPTS) -> None:
        self.kind, self.peer, self.home, self.args, self.jvm_opts = kind, peer, Path(home), args, jvm_opts
        self.home.mkdir(parents=True, exist_ok=True)
        conf = self.home / "conf"
        conf.mkdir(exist_ok=True)
        for name in ("namesrv", "broker", "tools"):
            (conf / f"logback_{name}.xml").write_text(_LOGBACK.format(log=self.home / f"{name}.log"))
        self.out_path = self.home / f"{kind}.out"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> JavaServer:
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        """Start the process without waiting for it (from the thread that outlives it: the child is killed when
        the thread that started it ends)."""
        if self.kind in ("broker", "proxy"):
            _check_host_disk(self.home)
        cmd = ["java", *self.jvm_opts, f"-Duser.home={self.home}", f"-Drocketmq.home.dir={self.home}",
               "-cp", classpath(self.peer), self.MAIN[self.kind], *self.args]  # fmt: skip
        env = {**os.environ, "ROCKETMQ_HOME": str(self.home)}
        with open(self.out_path, "ab") as out:
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.home, env=env,
                                            start_new_session=True, preexec_fn=_die_with_parent)  # fmt: skip

    def wait_ready(self) -> JavaServer:
        wait_until(self._ready, START_TIMEOUT, what=f"Apache RocketMQ {self.kind} ({self.peer}) to start")
        return self

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def listen_port(self) -> int:
        """The one TCP port a started NameServer listens on: its own pick when its listenPort is 0 (RocketMQ 4.x
        does not print it, so it is read from the process's sockets)."""
        assert self.process is not None
        ports = listening_ports(self.process.pid)
        assert len(ports) == 1, f"the {self.kind} listens on {sorted(ports)}, not on one port"
        return ports.pop()

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"{self.kind} ({self.peer}) exited with {self.process.returncode}:\n"
                                 f"{self.output()[-4000:]}")  # fmt: skip
        return self.READY[self.kind] in self.output()

    def stop(self) -> int | None:
        """SIGTERM (RocketMQ's shutdown hook flushes and removes ``abort``), then wait; SIGKILL past the bound."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.kind} ({self.peer}) ignored SIGTERM for {STOP_TIMEOUT}s") from None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> JavaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self.kill()


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its socket inodes matched in /proc/net/tcp, state LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if (target := os.readlink(fd)).startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# RocketMQ's broker caps both ratios at these whatever its config or system properties say
JAVA_CLEAN_FORCIBLY_RATIO, JAVA_WARNING_LEVEL_RATIO = 0.85, 0.90


def _check_host_disk(path: Path) -> None:
    """Apache RocketMQ's broker reads the host's disk (mqlake's stores in the tests read a pinned figure,
    tests/host_disk.py): above 85 % it expires files at once, above 90 % it refuses every put. A test would then
    fail far from the cause, so the start fails here, naming it."""
    used = disk_used_ratio(path)  # RocketMQ's measure; the suite's pin replaces only the store's own reference
    assert used < JAVA_CLEAN_FORCIBLY_RATIO, (
        f"the disk under {path} is {used:.0%} full: Apache RocketMQ's broker expires files at once above "
        f"{JAVA_CLEAN_FORCIBLY_RATIO:.0%} and refuses puts above {JAVA_WARNING_LEVEL_RATIO:.0%} of it; free some space")


def broker_listen_port() -> int:
    """A listenPort for a Java broker: RocketMQ's BrokerStartup also binds listenPort - 2 (the VIP channel) and
    listenPort + 1 (HA, whatever haListenPort says), so all three must be free."""
    return unassigned_port(-2, 1)


def write_conf(path: Path, values: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()), encoding="latin-1")
    return path


class JavaCluster:
    """An Apache RocketMQ NameServer and one broker (``peer`` "rocketmq-4-broker" or "rocketmq-5") on loopback,
    on ``store`` (a store mqlake wrote, or a fresh one). With ``proxy=True`` (5.x only) the broker runs inside
    RocketMQ's proxy in local mode and ``grpc_endpoint`` is its gRPC port.

    ``broker_conf`` adds or overrides broker.conf keys (RocketMQ's names); ``jvm_opts`` replaces both JVMs' options.
    """

    def __init__(self, peer: str, home: Path, store: Path, proxy: bool = False,
                 jvm_opts: tuple[str, ...] = JVM_OPTS, **broker_conf: object) -> None:  # fmt: skip
        self.peer, self.home, self.store, self.proxy = peer, Path(home), Path(store), proxy
        self.jvm_opts, self.broker_conf = jvm_opts, broker_conf
        # The broker's ports are chosen here: BrokerStartup derives its VIP (listenPort - 2) and HA (listenPort + 1)
        # ports from listenPort, and the proxy's cannot be read back; the NameServer binds port 0 and reports it.
        self.broker_port = broker_listen_port()
        self.broker_addr = f"127.0.0.1:{self.broker_port}"
        self.grpc_port = unassigned_port() if proxy else None
        self.grpc_endpoint = f"127.0.0.1:{self.grpc_port}" if proxy else None
        ns_conf = write_conf(self.home / "namesrv.conf", {"listenPort": 0})
        self.namesrv = JavaServer("namesrv", peer, self.home / "namesrv", "-c", str(ns_conf), jvm_opts=jvm_opts)
        self.broker: JavaServer | None = None
        self._namesrv_addr: str | None = None

    @property
    def namesrv_addr(self) -> str:
        assert self._namesrv_addr is not None, "the NameServer's port is known once it has started"
        return self._namesrv_addr

    def _broker_server(self) -> JavaServer:
        conf = {
            "brokerClusterName": "DefaultCluster", "brokerName": "broker-a", "brokerId": 0,
            "namesrvAddr": self.namesrv_addr, "brokerIP1": "127.0.0.1", "listenPort": self.broker_port,
            "storePathRootDir": self.store,
            "storePathCommitLog": self.store / "commitlog", "autoCreateTopicEnable": "true",
            # a send waiting in the broker's queue past 200 ms, or a put holding its lock past 1 s, is refused
            # "broker busy" (SYSTEM_BUSY): on a loaded 2-core machine that is a matter of load, not of the test
            "waitTimeMillsInSendQueue": 60000, "osPageCacheBusyTimeOutMills": 60000,
            **self.broker_conf,
        }  # fmt: skip
        broker_path = write_conf(self.home / "broker.conf", conf)
        if not self.proxy:
            return JavaServer("broker", self.peer, self.home / "broker", "-c", str(broker_path), jvm_opts=self.jvm_opts)
        proxy_json = self.home / "rmq-proxy.json"
        proxy_json.write_text(json.dumps({"rocketMQClusterName": "DefaultCluster", "namesrvAddr": self.namesrv_addr,
                                          "grpcServerPort": self.grpc_port, "remotingListenPort": unassigned_port()}))
        return JavaServer("proxy", self.peer, self.home / "proxy", "-pm", "local", "-bc", str(broker_path),
                          "-pc", str(proxy_json), jvm_opts=self.jvm_opts)  # fmt: skip

    def start(self) -> JavaCluster:
        self.namesrv.start()
        try:
            self._namesrv_addr = f"127.0.0.1:{self.namesrv.listen_port()}"
            self.broker = self._broker_server()
            self.broker.start()
            # 5.x logs "boot success" before its first registration with the NameServer has landed: a client
            # started then finds no route to the broker
            wait_until(self._registered, START_TIMEOUT, what=f"{self.broker_addr} registered with {self.namesrv_addr}")
        except BaseException:
            if self.broker is not None:
                self.broker.kill()
            self.namesrv.kill()
            raise
        return self

    def _registered(self) -> bool:
        async def addrs() -> set[str]:
            async with Admin(self.namesrv_addr) as admin:
                info = await admin.cluster_info()
            return {a for b in info.broker_addr_table.values() for a in b.broker_addrs.values()}

        return self.broker_addr in run(addrs())

    def stop(self) -> None:
        try:
            if self.broker is not None:
                self.broker.stop()
        finally:
            if self.broker is not None:
                self.broker.kill()
            self.namesrv.kill()

    def __enter__(self) -> JavaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def java_json(main: str, peer: str, *args: str, classes: Path, home: Path, timeout: float = 300.0) -> dict:
    """Run a program of tests/java that prints one JSON document on a line of its own (the clients log around it)
    and return that document; a failed run or a missing document fails with the program's output."""
    proc = java(main, peer, *args, classes=classes, home=home, timeout=timeout)
    docs = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and len(docs) == 1, (
        f"{main} {' '.join(args)} exited with {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return json.loads(docs[0])


# A controller node keeps little: its Raft log and state machine in a few MiB
CONTROLLER_JVM_OPTS = ("-Xms64m", "-Xmx192m", *JVM_OPTS[2:])
MQADMIN = "org.apache.rocketmq.tools.command.MQAdminStartup"


class ControllerCluster:
    """Apache RocketMQ 5.4.0's controller (``ControllerStartup``, ``controllerType=DLedger``): ``nodes`` processes
    on loopback forming one DLedger Raft group.  In DLedger mode a node serves the controller's requests on its
    DLedger peer port (the DLedger server's remoting server carries both), so ``addrs`` are the addresses brokers
    would list in ``controllerAddr``."""

    GROUP = "mqlake-controllers"

    def __init__(self, home: Path, nodes: int = 3, jvm_opts: tuple[str, ...] = CONTROLLER_JVM_OPTS,
                 **conf: object) -> None:
        """``conf``: more ``ControllerConfig`` keys for every node (e.g. ``scanNotActiveBrokerInterval``)."""
        self.home = Path(home)
        self.nodes, self.jvm_opts, self.conf = nodes, jvm_opts, conf
        self.ids = [f"n{i}" for i in range(nodes)]
        self.servers: list[JavaServer] = []
        self._configure()

    def _configure(self) -> None:
        """Choose the nodes' ports and write their configs: every node must know its peers' ports before any
        starts, so they cannot be bound at port 0 and reported back."""
        self.ports = [unassigned_port() for _ in range(self.nodes)]
        self.addrs = [f"127.0.0.1:{port}" for port in self.ports]
        peers = ";".join(f"{node}-{addr}" for node, addr in zip(self.ids, self.addrs, strict=True))
        self.servers = []
        for node, port in zip(self.ids, self.ports, strict=True):
            node_home = self.home / node
            if node_home.exists():
                shutil.rmtree(node_home)  # a try that lost a port race: nothing of it is kept
            path = write_conf(node_home / "controller.conf", {
                "controllerType": "DLedger", "controllerDLegerGroup": self.GROUP, "controllerDLegerPeers": peers,
                "controllerDLegerSelfId": node, "controllerStorePath": node_home / "store",
                "configStorePath": node_home / "controller.properties",
                "listenPort": port, "bindAddress": "127.0.0.1",
                "mappedFileSize": 4 * 1024 * 1024,  # the Raft log's segment (1 GiB by default)
                **self.conf,
            })  # fmt: skip
            self.servers.append(JavaServer("controller", "rocketmq-5", node_home, "-c", str(path),
                                           jvm_opts=self.jvm_opts))  # fmt: skip

    def start(self) -> ControllerCluster:
        """Start every node at once (a node's election waits for the others) and return when all say they booted.
        A port chosen for a node and taken by another process before the node bound it: the group is started
        again on new ports (at most three tries)."""
        tries = 3
        for attempt in range(1, tries + 1):
            try:
                for server in self.servers:
                    server.launch()
                for server in self.servers:
                    server.wait_ready()
                return self
            except BaseException as e:
                self.stop()
                if attempt == tries or not (isinstance(e, AssertionError) and "Address already in use" in str(e)):
                    raise
                self._configure()
        raise AssertionError("unreachable: the last try returns or raises")

    def metadata_info(self, addr: str) -> dict[str, str] | None:
        """CONTROLLER_GET_METADATA_INFO (1005) asked of the node at ``addr``: its answer's header fields (group,
        controllerLeaderId, controllerLeaderAddress, isLeader, peers); None while it refuses (a node just booted
        answers SYSTEM_BUSY for a while)."""
        r = remoting_call(addr, RequestCode.CONTROLLER_GET_METADATA_INFO)
        return dict(r.ext_fields) if r.code == 0 else None

    def leader_named_by(self, addr: str, other_than: str | None = None, timeout: float = 60.0) -> str:
        """The controller id the node at ``addr`` names as its leader, once it names one of ``ids`` (and not
        ``other_than``): a node answers without ``controllerLeaderId`` until it hears from an elected leader."""
        named: list[str] = []

        def names_one() -> bool:
            info = self.metadata_info(addr)
            leader = info.get("controllerLeaderId") if info else None
            named[:] = [leader] if leader in self.ids and leader != other_than else []
            return bool(named)

        wait_until(names_one, timeout, what=f"the controller at {addr} to name a leader")
        return named[0]

    def metadata(self, addr: str) -> dict[str, str]:
        """``mqadmin getControllerMetaData -a addr`` (CONTROLLER_GET_METADATA_INFO) as printed: ControllerGroup,
        ControllerLeaderId, ControllerLeaderAddress, and Peer (the peers joined by ';')."""
        # A NameServer address that nothing serves (without one the admin client looks it up over HTTP first): a
        # port held bound and not listening refuses every connection while the call runs
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            nowhere = f"127.0.0.1:{held.getsockname()[1]}"
            proc = java(MQADMIN, "rocketmq-5", "getControllerMetaData", "-a", addr, "-n", nowhere,
                        home=self.home / "mqadmin", timeout=120)  # fmt: skip
        assert proc.returncode == 0, f"getControllerMetaData -a {addr}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        out: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            key, _, value = line.partition("\t")
            if key.startswith("#") and value:
                name = key[1:].rstrip(":")
                out[name] = f"{out[name]};{value}" if name in out else value
        return out

    def stop(self) -> None:
        for server in self.servers:
            try:
                server.stop()
            finally:
                server.kill()

    def __enter__(self) -> ControllerCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
