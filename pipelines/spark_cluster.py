"""A Spark standalone cluster on this machine: one master and N workers from PySpark's own distribution.

The JVMs are started with ``$SPARK_HOME/bin/spark-class`` (``SPARK_HOME`` is the installed ``pyspark``
package, which ships the scripts and jars), every one bound to 127.0.0.1, each in a process group of its
own so that stopping a worker also ends the executor JVMs and Python workers it launched.  ``start`` returns
once the master's JSON status lists every worker ALIVE (polled with a deadline).

``python -m pipelines.spark_cluster`` (``make spark-cluster``) runs one in the foreground until Ctrl-C.
The pipelines reach it with ``--master spark://127.0.0.1:PORT`` in client deploy mode (the driver is the
``mqlake`` process); see docs/scaling.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from store.errors import MQLakeError

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(MQLakeError, RuntimeError):
    """The standalone cluster did not come up (its log files are named)."""


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package."""
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class StandaloneCluster:
    """A master and ``workers`` workers (``worker_cores`` cores, ``worker_memory`` each) under ``work_dir``:
    ``master.log``, ``worker-N.log`` and each worker's ``worker-N/`` work dir (executor logs and files).

    ``worker_prefix``: a command the workers (and so their executors) run under, e.g. ``unshare`` giving them
    another view of the file system than the driver's."""

    def __init__(
        self, work_dir: Path, *, workers: int = 2, worker_cores: int = 1, worker_memory: str = "1g",
        worker_prefix: Sequence[str] = (),
    ) -> None:  # fmt: skip
        self.work_dir = Path(work_dir).absolute()
        self.workers, self.worker_cores, self.worker_memory = workers, worker_cores, worker_memory
        self.worker_prefix = list(worker_prefix)
        self.port = self.webui_port = 0
        self._procs: list[tuple[str, subprocess.Popen]] = []

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{HOST}:{self.webui_port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP=HOST,
            SPARK_DAEMON_MEMORY="256m",  # the master and workers only schedule; executors get their own heap
            # C1-only JIT: the daemons start seconds sooner; they do no heavy work
            SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1",
        )
        return env

    def _spawn(self, name: str, args: list[str], prefix: Sequence[str] = ()) -> None:
        log = open(self.work_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child holds it; closed below
        try:
            proc = subprocess.Popen(
                [*prefix, str(spark_home() / "bin" / "spark-class"), *args], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=self._env(), cwd=self.work_dir, start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()
        self._procs.append((name, proc))

    def start(self, timeout: float = 120.0) -> Self:
        """Start the master and the workers; return once all workers are registered ALIVE."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.webui_port = free_port(), free_port()
        try:
            self._spawn("master", [MASTER_CLASS, "--host", HOST, "--port", str(self.port),
                                   "--webui-port", str(self.webui_port)])  # fmt: skip
            for n in range(self.workers):
                work = self.work_dir / f"worker-{n}"
                work.mkdir(exist_ok=True)
                self._spawn(f"worker-{n}", [
                    WORKER_CLASS, "--host", HOST, "--port", "0", "--webui-port", "0",
                    "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                    "--work-dir", str(work), self.master_url,
                ], self.worker_prefix)  # fmt: skip
            self._wait_workers(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def status(self) -> dict:
        """The master's JSON status: ``workers``, ``aliveworkers``, ``activeapps``, ``completedapps``, ..."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> list[dict]:
        return [w for w in self.status()["workers"] if w["state"] == "ALIVE"]

    def _wait_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        alive: list[dict] = []
        while time.monotonic() < deadline:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise SparkClusterError(
                        f"Spark {name} exited with code {proc.returncode}; see {self.work_dir / (name + '.log')}"
                    )
            try:
                alive = self.alive_workers()
            except (urllib.error.URLError, OSError, ValueError):
                alive = []  # the master's web UI is not up yet
            if len(alive) >= self.workers:
                return
            time.sleep(0.2)
        raise SparkClusterError(
            f"{len(alive)} of {self.workers} Spark workers registered with {self.master_url} in {timeout:.0f} s; "
            f"see the logs in {self.work_dir}"
        )

    def kill_worker(self, n: int) -> None:
        """SIGKILL worker ``n`` with the executors it launched, as when its machine is lost."""
        _signal_group(dict(self._procs)[f"worker-{n}"], signal.SIGKILL)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the workers (and the executors they launched), then the master: SIGTERM to each process
        group, SIGKILL to a group still there after ``timeout``."""
        procs, self._procs = list(reversed(self._procs)), []
        for _, proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            # the group outlives its leader when an executor or Python worker is still exiting
            _signal_group(proc, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the leader's pid


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # Ctrl-C and SIGTERM stop the cluster alike


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pipelines.spark_cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path(".mqlake/spark"), help="logs and work dirs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-cores", type=int, default=1)
    parser.add_argument("--worker-memory", default="1g")
    args = parser.parse_args(argv)
    cluster = StandaloneCluster(args.work_dir, workers=args.workers, worker_cores=args.worker_cores,
                                worker_memory=args.worker_memory)  # fmt: skip
    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a shell's background job starts with it ignored
        signal.signal(sig, _interrupt)
    try:
        cluster.start()
        print(f"Spark standalone cluster: {cluster.master_url}  (web UI {cluster.webui_url}, "
              f"{args.workers} workers, logs in {cluster.work_dir}); Ctrl-C stops it", flush=True)  # fmt: skip
        print(f"  e.g. mqlake tier --store-dir STORE --lake LAKE --master {cluster.master_url}", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print("stopping the Spark cluster", file=sys.stderr, flush=True)
    except SparkClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
