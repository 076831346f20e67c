"""A local S3-compatible endpoint for the tests: moto's server mode (PyPI ``moto[server]``) in a child process on a
loopback port the OS picks at the first start (read off the server's "Running on" line), polled until it answers.
:meth:`S3Server.down` stops it (a client then sees connections refused) and :meth:`S3Server.up` starts it again on
the same port; moto keeps its buckets in memory, so it comes back empty and the bucket is created again.

Why moto: it runs standalone from PyPI, and it enforces the conditional puts delta-rs commits with
(``If-None-Match: *`` answered 412 when the key exists, ``If-Match`` against the ETag).  No Debian package
ships an S3 gateway that runs standalone here.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import wait_until

START_TIMEOUT = 60.0
BUCKET = "mqlake-test"
KEY_ID, SECRET = "test-key-id", "test-secret"  # moto accepts any


class S3Server:
    """moto's S3 server on ``endpoint``, with one bucket (:data:`BUCKET`)."""

    def __init__(self, work_dir: Path) -> None:
        self.port = 0  # the OS's pick at the first start, kept for a restart
        self.log_path = Path(work_dir) / "moto.log"
        self.process: subprocess.Popen | None = None
        self._log_offset = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The AWS settings a client of the lake reads (lake/objectstore.py)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ALLOW_HTTP": "true",
        }  # fmt: skip

    def start(self) -> S3Server:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        wait_until(self._ready, START_TIMEOUT, what=f"moto's S3 server (port {self.port or 'to be picked'})")
        self.create_bucket()
        return self

    def down(self) -> None:
        self.stop()

    def up(self) -> None:
        self.start()

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"moto server exited with {self.process.returncode}: {self.log_path.read_text()}")
        if not self.port:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                running = re.search(rb"Running on http://127\.0\.0\.1:(\d+)", f.read())
            if running is None:
                return False
            self.port = int(running.group(1))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/moto-api/", timeout=2):
                return True
        except OSError:
            return False

    def _client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=KEY_ID,
                            aws_secret_access_key=SECRET)  # fmt: skip

    def create_bucket(self, name: str = BUCKET) -> str:
        self._client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str) -> list[str]:
        s3 = self._client()
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@contextlib.contextmanager
def aws_env(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block (child processes and Spark's Python workers inherit them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def running_s3(work_dir: Path) -> Iterator[S3Server]:
    """A started :class:`S3Server` whose settings are in ``os.environ`` for the block (:func:`aws_env`)."""
    server = S3Server(work_dir).start()
    try:
        with aws_env(server.env()):
            yield server
    finally:
        server.stop()
