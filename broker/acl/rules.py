"""``plain_acl.yml``: RocketMQ's plain ACL file, read into a validated model and written back in the same shape.

Keys as RocketMQ names them: ``globalWhiteRemoteAddresses`` (address patterns), ``accounts`` (each with
``accessKey``, ``secretKey``, ``whiteRemoteAddress``, ``admin``, ``defaultTopicPerm``, ``defaultGroupPerm``,
``topicPerms`` and ``groupPerms`` as ``name=PERM`` lists) and ``dataVersion``. A file that does not parse or
does not fit raises AclConfigError naming the file and the line of the offending entry; secrets never appear in
those messages.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from broker.acl.addresses import AddressPattern, AddressPatternError, compile_pattern
from store.config import _camel
from store.errors import MQLakeError

DENY = 1
ANY = 2
PUB = 4
SUB = 8
_PERMS = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}
MIN_KEY_LENGTH = 7  # RocketMQ refuses access and secret keys of 6 characters or fewer


class AclConfigError(MQLakeError, ValueError):
    """An ACL file (or an update to it) that cannot be used; the message names the file, line and key."""


def parse_perm(text: str | None) -> int:
    """``PUB``, ``SUB``, ``PUB|SUB`` (or ``SUB|PUB``), ``DENY``; None is DENY, as RocketMQ reads a missing one."""
    if text is None:
        return DENY
    try:
        return _PERMS[text.strip()]
    except KeyError:
        raise ValueError(f"permission {text!r} is not one of DENY, PUB, SUB, PUB|SUB") from None


def parse_resource_perm(item: str) -> tuple[str, int]:
    """``name=PERM`` -> (name, perm bits)."""
    name, sep, perm = item.partition("=")
    if not sep or not name.strip() or "=" in perm:
        raise ValueError(f"{item!r} is not name=PERM (e.g. topicA=SUB)")
    return name.strip(), parse_perm(perm)


def _check_pattern(value: str | None) -> str | None:
    try:
        compile_pattern(value)
    except AddressPatternError as e:
        raise ValueError(str(e)) from None
    return value


class Account(BaseModel):
    """One entry of ``accounts`` (``PlainAccessConfig``)."""

    model_config = ConfigDict(alias_generator=_camel, populate_by_name=True, extra="forbid")

    access_key: str = Field(min_length=MIN_KEY_LENGTH)
    secret_key: str = Field(min_length=MIN_KEY_LENGTH, repr=False)
    white_remote_address: str | None = None
    admin: bool = False
    default_topic_perm: str | None = None
    default_group_perm: str | None = None
    topic_perms: list[str] = Field(default_factory=list)
    group_perms: list[str] = Field(default_factory=list)

    @field_validator("access_key", "secret_key", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        # YAML reads an all-digit key as a number; RocketMQ takes it as its text.
        return str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v

    @field_validator("white_remote_address")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        return _check_pattern(v)

    @field_validator("default_topic_perm", "default_group_perm")
    @classmethod
    def _perm(cls, v: str | None) -> str | None:
        parse_perm(v)
        return v

    @field_validator("topic_perms", "group_perms", mode="before")
    @classmethod
    def _resource_perms(cls, v: Any) -> Any:
        if v is None:
            return []
        if isinstance(v, list):
            for item in v:
                try:
                    parse_resource_perm(str(item))
                except ValueError as e:
                    raise ValueError(f"{item!r}: {e}") from None
            return [str(item) for item in v]
        return v

    def to_yaml(self) -> dict[str, Any]:
        """The entry as RocketMQ writes it (only the keys that are set)."""
        out: dict[str, Any] = {"accessKey": self.access_key, "secretKey": self.secret_key}
        if self.white_remote_address is not None:
            out["whiteRemoteAddress"] = self.white_remote_address
        out["admin"] = self.admin
        if self.default_topic_perm is not None:
            out["defaultTopicPerm"] = self.default_topic_perm
        if self.default_group_perm is not None:
            out["defaultGroupPerm"] = self.default_group_perm
        if self.topic_perms:
            out["topicPerms"] = list(self.topic_perms)
        if self.group_perms:
            out["groupPerms"] = list(self.group_perms)
        return out


class DataVersion(BaseModel):
    model_config = ConfigDict(extra="ignore")

    timestamp: int = 0
    counter: int = 0


class AclFile(BaseModel):
    """The whole file (``PlainAccessData``)."""

    model_config = ConfigDict(alias_generator=_camel, populate_by_name=True, extra="forbid")

    global_white_remote_addresses: list[str] = Field(default_factory=list)
    accounts: list[Account] = Field(default_factory=list)
    data_version: list[DataVersion] = Field(default_factory=list)

    @field_validator("global_white_remote_addresses", "accounts", "data_version", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return [] if v is None else v

    @field_validator("global_white_remote_addresses")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        for item in v:
            _check_pattern(item)
        return v

    @field_validator("accounts")
    @classmethod
    def _unique(cls, v: list[Account]) -> list[Account]:
        seen: set[str] = set()
        for account in v:
            if account.access_key in seen:
                raise ValueError(f"accessKey {account.access_key!r} appears twice")
            seen.add(account.access_key)
        return v

    def white_patterns(self) -> list[AddressPattern]:
        return [compile_pattern(p) for p in self.global_white_remote_addresses]

    def to_yaml(self) -> dict[str, Any]:
        return {
            "globalWhiteRemoteAddresses": list(self.global_white_remote_addresses),
            "accounts": [a.to_yaml() for a in self.accounts],
            "dataVersion": [{"timestamp": d.timestamp, "counter": d.counter} for d in self.data_version],
        }


# --- reading and writing ----------------------------------------------------------------------------------------


def _line_of(root: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """The 1-based line of the YAML node at pydantic's error location ``loc`` (its deepest ancestor found)."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for step in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if getattr(k, "value", None) == step), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and 0 <= step < len(node.value):
            node = node.value[step]
        else:
            node = None
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def _problem(e: dict[str, Any]) -> str:
    where = ".".join(str(p) for p in e["loc"]) or "<file>"
    # pydantic's input_value may be a secret: name the key, never echo the value
    return f"{where}: {e['msg'].removeprefix('Value error, ')}"


def parse_acl(text: str, source: str) -> AclFile:
    """Parse the text of an ACL file; ``source`` names it in errors."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise AclConfigError(f"{where}: not valid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise AclConfigError(f"{source}: not valid YAML: {type(e).__name__}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AclConfigError(f"{source}:1: the ACL file must be a mapping, not {type(data).__name__}")
    try:
        return AclFile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        line = _line_of(root, first["loc"])
        where = f"{source}:{line}" if line is not None else source
        problems = "; ".join(_problem(dict(e)) for e in err.errors())
        raise AclConfigError(f"{where}: invalid ACL file: {problems}") from None


def read_acl(path: Path) -> tuple[AclFile, bytes]:
    """(the parsed file, its bytes); a missing or unreadable file is an AclConfigError naming it."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise AclConfigError(f"{path}: cannot read the ACL file: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise AclConfigError(f"{path}:{line}: not UTF-8 text") from None
    return parse_acl(text, str(path)), raw


def write_acl(path: Path, acl: AclFile) -> bytes:
    """Write atomically (a reader or the watcher never sees half a file); returns the bytes written."""
    raw = yaml.safe_dump(acl.to_yaml(), sort_keys=False, default_flow_style=False, allow_unicode=True).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o600)  # it holds secrets
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return raw
