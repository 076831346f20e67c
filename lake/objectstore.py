"""A lake root on S3-compatible object storage (``s3://bucket/prefix``): where its settings come from, the options
delta-rs and pyarrow get, and the errors a caller sees when the endpoint cannot be reached.

Settings come from the usual AWS environment variables, read when a lake is opened (so a job, the broker and
every Spark executor started from the same environment agree): ``AWS_ENDPOINT_URL`` (an S3-compatible server;
unset: AWS itself), ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
``AWS_SESSION_TOKEN``, ``AWS_ALLOW_HTTP=true`` for a plain-http endpoint.  There is no config file block: one
source of truth that delta-rs, pyarrow and the AWS tools all read the same way.

Concurrent writers.  delta-rs (1.x) commits a table version by creating ``_delta_log/<version>.json`` with a
conditional put (``If-None-Match: *``), so of two writers racing for a version one gets a conflict and retries
at the next version; ``conditional_put=etag`` is set explicitly so the If-Match updates object_store does are
conditional too.  ``AWS_S3_ALLOW_UNSAFE_RENAME`` (copy-then-delete commits, which let a second writer replace
a first one's version) is refused, and there is no lock table to configure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from store.errors import MQLakeError

SCHEME = "s3://"
DEFAULT_REGION = "us-east-1"
# A commit against an endpoint that is down fails after this many tries instead of retrying for minutes
# (object_store's default): the tier job keeps everything local and the next run commits.
MAX_RETRIES = 2
RETRY_TIMEOUT = "20s"
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 60.0
UNSAFE_RENAME = "AWS_S3_ALLOW_UNSAFE_RENAME"
_SETTING_VARS = frozenset({
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ALLOW_HTTP", UNSAFE_RENAME,
})  # fmt: skip


class ObjectStoreError(MQLakeError, RuntimeError):
    """A lake on object storage that cannot be reached, or is configured unsafely."""


# AWS settings a driver handed to this process (a Spark Python worker: its environment is the one its JVM
# started with, which on a cluster is not the driver's)
_handed: dict[str, str] = {}


def settings_env() -> dict[str, str]:
    """The AWS settings in effect here, as environment variables: for a driver to hand to its Spark tasks."""
    env = {**os.environ, **_handed}
    return {k: v for k, v in env.items() if k in _SETTING_VARS}


def configure(env: Mapping[str, str]) -> None:
    """Use ``env`` (from :func:`settings_env` on the driver) over this process's environment."""
    _handed.update({k: v for k, v in env.items() if k in _SETTING_VARS})


def is_remote(location: str | os.PathLike[str] | None) -> bool:
    """Is ``location`` an object-store URI (``s3://...``) rather than a local directory?"""
    return location is not None and str(location).startswith(SCHEME)


def lake_location(value: str | os.PathLike[str]) -> str | Path:
    """A lake root as given: an ``s3://bucket/prefix`` URI (kept as text, trailing ``/`` dropped; ``Path`` would
    fold its ``//``) or a local directory (a ``Path``)."""
    text = str(value)
    if "://" in text and not is_remote(text):
        raise ObjectStoreError(f"{text}: only local directories and s3://bucket/prefix lake roots are supported")
    if is_remote(text):
        bucket = text[len(SCHEME) :].split("/", 1)[0]
        if not bucket:
            raise ObjectStoreError(f"{text}: no bucket (expected s3://bucket/prefix)")
        return text.rstrip("/")
    return Path(text)


def join(root: str | os.PathLike[str], *names: str) -> str:
    """``root/name/...`` as a table or file location (absolute for a local root)."""
    if is_remote(root):
        return "/".join([str(root).rstrip("/"), *names])
    return str(Path(root).absolute().joinpath(*names))


def key_of(uri: str) -> str:
    """``bucket/key`` of an ``s3://`` URI: the path pyarrow's S3FileSystem takes."""
    return uri[len(SCHEME) :] if is_remote(uri) else uri


@dataclass(frozen=True)
class S3Settings:
    """Where and as whom the lake's bucket is reached (from the AWS environment variables)."""

    endpoint_url: str | None
    region: str
    access_key_id: str | None
    secret_access_key: str | None
    session_token: str | None
    allow_http: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        """From ``env`` (default: the process environment, with what :func:`configure` handed it on top)."""
        env = {**os.environ, **_handed} if env is None else env
        if env.get(UNSAFE_RENAME, "").strip().lower() in ("1", "true", "yes"):
            raise ObjectStoreError(
                f"{UNSAFE_RENAME} is set: it lets two writers replace each other's Delta commits on S3; unset it "
                f"(mqlake commits with conditional puts, which S3 and S3-compatible servers support)"
            )
        return cls(
            endpoint_url=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
            access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
            allow_http=env.get("AWS_ALLOW_HTTP", "").strip().lower() in ("1", "true", "yes"),
        )

    @property
    def endpoint(self) -> str:
        """The endpoint as an error message names it."""
        return self.endpoint_url or f"AWS S3 ({self.region})"

    def s3a_settings(self) -> dict[str, str]:
        """Hadoop settings that point ``s3://`` URIs at ``S3AFileSystem`` and this endpoint (Spark's side of the
        lake).  No secret among them: the AWS SDK's default chain finds the credentials in each JVM."""
        conf = {
            "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
            "fs.s3a.aws.credentials.provider": "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
            "fs.s3a.endpoint.region": self.region,
            # an endpoint that is down fails a query in seconds, as the delta-rs side does
            "fs.s3a.attempts.maximum": str(MAX_RETRIES),
            "fs.s3a.retry.limit": str(MAX_RETRIES),
            "fs.s3a.connection.establish.timeout": f"{int(CONNECT_TIMEOUT_S)}s",
        }
        if self.endpoint_url:  # an S3-compatible server: addressed by path, as such servers expect
            conf |= {"fs.s3a.endpoint": self.endpoint_url, "fs.s3a.path.style.access": "true"}
            if self.endpoint_url.startswith("http://"):
                conf["fs.s3a.connection.ssl.enabled"] = "false"
        return conf

    def storage_options(self) -> dict[str, str]:
        """delta-rs ``storage_options``."""
        opts = {
            "AWS_REGION": self.region,
            "conditional_put": "etag",
            "max_retries": str(MAX_RETRIES),
            "retry_timeout": RETRY_TIMEOUT,
            "connect_timeout": f"{int(CONNECT_TIMEOUT_S)}s",
        }
        if self.endpoint_url:
            opts["AWS_ENDPOINT_URL"] = self.endpoint_url
        if self.allow_http:
            opts["AWS_ALLOW_HTTP"] = "true"
        for key, value in (
            ("AWS_ACCESS_KEY_ID", self.access_key_id),
            ("AWS_SECRET_ACCESS_KEY", self.secret_access_key),
            ("AWS_SESSION_TOKEN", self.session_token),
        ):
            if value:
                opts[key] = value
        return opts

    def filesystem(self) -> Any:
        """A pyarrow ``S3FileSystem`` on these settings."""
        from pyarrow import fs

        kwargs: dict[str, Any] = {
            "region": self.region,
            "connect_timeout": CONNECT_TIMEOUT_S,
            "request_timeout": REQUEST_TIMEOUT_S,
            "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=MAX_RETRIES + 1),
        }
        if self.endpoint_url:
            scheme, sep, rest = self.endpoint_url.partition("://")
            kwargs["endpoint_override"] = rest if sep else self.endpoint_url
            kwargs["scheme"] = scheme if sep else ("http" if self.allow_http else "https")
        if self.access_key_id:
            kwargs["access_key"] = self.access_key_id
            kwargs["secret_key"] = self.secret_access_key
            kwargs["session_token"] = self.session_token
        return fs.S3FileSystem(**kwargs)


def storage_options(location: str | os.PathLike[str]) -> dict[str, str] | None:
    """delta-rs ``storage_options`` for a table at ``location`` (None: a local table needs none)."""
    return S3Settings.from_env().storage_options() if is_remote(location) else None


def filesystem(location: str | os.PathLike[str]) -> tuple[Any, str]:
    """(pyarrow filesystem, path in it) of a file or directory at ``location``, local or ``s3://``."""
    if is_remote(location):
        return S3Settings.from_env().filesystem(), key_of(str(location))
    from pyarrow import fs

    return fs.LocalFileSystem(), str(location)


def endpoint_of(location: str | os.PathLike[str]) -> str:
    return S3Settings.from_env().endpoint if is_remote(location) else str(location)


@contextmanager
def reaching(location: str | os.PathLike[str], action: str) -> Iterator[None]:
    """Errors reaching a remote ``location`` during ``action`` (connection refused, timeouts, errors answered by
    the server) raised again as an :class:`ObjectStoreError` naming the endpoint; delta-rs' protocol errors (a
    commit conflict) and a local location's errors pass as they are."""
    if not is_remote(location):
        yield
        return
    try:
        yield
    except OSError as e:  # delta-rs and pyarrow raise their S3 client errors as OSError
        if isinstance(e, FileNotFoundError):
            raise  # answered: the object is not there
        raise ObjectStoreError(
            f"{action} failed: S3 endpoint {endpoint_of(location)}, {location} "
            f"({type(e).__name__}: {_first_line(e)})"
        ) from e


def _first_line(e: BaseException) -> str:
    """The error's first line and, for delta-rs' chain of causes (``↳`` lines), its root cause."""
    lines = [re.sub(r"\x1b\[[0-9;]*m|↳", "", line).strip() for line in str(e).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return type(e).__name__
    return (lines[0] if len(lines) == 1 else f"{lines[0]}: {lines[-1]}")[:300]


def upload(files: list[Path], local_root: Path, remote_root: str) -> list[str]:
    """Copy ``files`` (under ``local_root``) to the same relative paths under ``remote_root``; returns their URIs."""
    from pyarrow import fs as pafs

    s3, base = filesystem(remote_root)
    local = pafs.LocalFileSystem()
    out = []
    with reaching(remote_root, f"uploading {len(files)} file(s)"):
        for f in files:
            rel = Path(f).absolute().relative_to(local_root.absolute()).as_posix()
            source = str(Path(f).absolute())
            pafs.copy_files(source, f"{base}/{rel}", source_filesystem=local, destination_filesystem=s3)
            out.append(f"{remote_root.rstrip('/')}/{rel}")
    return out


def child_dirs(location: str | os.PathLike[str]) -> list[str]:
    """Names of the directories (``/``-separated prefixes on S3) directly under ``location``, sorted."""
    from pyarrow import fs as pafs

    fsys, base = filesystem(location)
    with reaching(location, "listing the lake"):
        infos = fsys.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)


def exists(location: str | os.PathLike[str]) -> bool:
    from pyarrow import fs as pafs

    fsys, base = filesystem(location)
    with reaching(location, "looking up"):
        return bool(fsys.get_file_info(base).type != pafs.FileType.NotFound)


STAGING_ENV = "MQLAKE_STAGING_DIR"


def local_staging_root() -> Path:
    """Where files bound for a lake on S3 are written before they are uploaded and committed: the tier's staged
    parquet (Spark tasks write it, so on a cluster every worker must see this directory at the same path) and
    the run reports.  ``$MQLAKE_STAGING_DIR``, else ``mqlake-staging`` in the system temp directory."""
    import tempfile

    return Path(os.environ.get(STAGING_ENV) or Path(tempfile.gettempdir()) / "mqlake-staging").absolute()


def reports_dir(lake: str | os.PathLike[str]) -> Path:
    """Where the jobs write their JSON run reports: ``LAKE/_reports`` for a local lake; for a lake on S3 the local
    staging root's ``_reports`` (the broker's metrics read the last runs from local files)."""
    return (local_staging_root() if is_remote(lake) else Path(lake)) / "_reports"
