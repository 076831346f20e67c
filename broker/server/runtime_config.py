"""GET_BROKER_CONFIG (26) and UPDATE_BROKER_CONFIG (25): the broker's settings as ``key=value`` lines, and the
ones that may change while it runs.

RocketMQ lets any setting be written at run time (most only act after a restart) and silently ignores keys it
does not know. mqlake takes only the keys it applies at once, and answers every other key with an error naming
it, so an operator never believes a change took effect when it did not:

- ``configBlackList``/``brokerConfigPath``: NO_PERMISSION "Can not update config in black list.", as Java;
- a key of neither config: INVALID_PARAMETER "unknown broker config key ...";
- a known key read only at start (names, ports, paths, file sizes, flush type): INVALID_PARAMETER naming it;
- a value that does not fit: INVALID_PARAMETER naming key and value.

Nothing changes unless every key of the request is accepted. Changes live in memory (broker.conf is the
operator's file and is not rewritten): a restart returns to broker.conf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from broker.config import BrokerConfig, parse_properties
from broker.remoting.codes import ResponseCode
from store.config import MessageStoreConfig, keys_where

CONFIG_BLACK_LIST = ("configBlackList", "brokerConfigPath")  # BrokerConfig.configBlackList's default

# Keys mqlake applies while running: the fields each model marks RUNTIME (each is read where it is used, or pushed
# by the apply hook).
RUNTIME_BROKER_KEYS = keys_where(BrokerConfig, "runtime")
RUNTIME_STORE_KEYS = keys_where(MessageStoreConfig, "runtime")


class ConfigUpdateRefused(Exception):
    """An UPDATE_BROKER_CONFIG answered with ``code`` and ``remark`` (nothing was changed)."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def _fields(model: BaseModel) -> dict[str, str]:
    """alias -> attribute name, of the plain settings (a field kept out of dumps, such as the TLS settings with
    their key password, is neither shown nor writable here)."""
    return {(f.alias or name): name for name, f in type(model).model_fields.items() if not f.exclude}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "value"):  # enums
        return str(value.value)
    if value is None:
        return ""
    return str(value)


def all_configs(broker: BrokerConfig, store: MessageStoreConfig) -> dict[str, str]:
    """Every setting under its RocketMQ name (``Configuration.getAllConfigs``)."""
    out: dict[str, str] = {}
    for model in (broker, store):
        for alias, attr in _fields(model).items():
            out[alias] = _text(getattr(model, attr))
    return dict(sorted(out.items()))


def format_configs(configs: dict[str, str]) -> bytes:
    """``MixAll.properties2String``: one ``key=value`` line each."""
    return "".join(f"{k}={v}\n" for k, v in configs.items()).encode("utf-8")


def update_configs(
    body: str, broker: BrokerConfig, store: MessageStoreConfig, apply: Callable[[set[str]], None] | None = None
) -> dict[str, str]:
    """Apply ``body`` (Java properties) to the live configs, all or nothing; returns the keys and values set.
    ``apply`` is told which keys changed (the broker re-registers on a permission change, for example)."""
    props = parse_properties(body, "updateBrokerConfig body")
    black = [k for k in props if k in CONFIG_BLACK_LIST]
    if black:
        raise ConfigUpdateRefused(ResponseCode.NO_PERMISSION, "Can not update config in black list.")
    broker_fields, store_fields = _fields(broker), _fields(store)
    plan: list[tuple[BaseModel, str, str]] = []
    for key, value in props.items():
        if key in RUNTIME_BROKER_KEYS:
            plan.append((broker, broker_fields[key], value))
        elif key in RUNTIME_STORE_KEYS:
            plan.append((store, store_fields[key], value))
        elif key in broker_fields or key in store_fields:
            raise ConfigUpdateRefused(ResponseCode.INVALID_PARAMETER,
                                      f"broker config key {key} cannot change at run time: set it in broker.conf "
                                      "and restart")  # fmt: skip
        else:
            raise ConfigUpdateRefused(ResponseCode.INVALID_PARAMETER, f"unknown broker config key {key}")
    # Validate every value on copies first: a bad one leaves the live configs untouched.
    copies = {id(broker): broker.model_copy(), id(store): store.model_copy()}
    for model, attr, value in plan:
        try:
            setattr(copies[id(model)], attr, value)
        except ValidationError as e:
            alias = next(a for a, n in _fields(model).items() if n == attr)
            reason = e.errors()[0]["msg"] if e.errors() else str(e)
            raise ConfigUpdateRefused(
                ResponseCode.INVALID_PARAMETER, f"invalid value for broker config key {alias}={value!r}: {reason}"
            ) from None
    for model, attr, _ in plan:
        setattr(model, attr, getattr(copies[id(model)], attr))
    if apply is not None and props:
        apply(set(props))
    return dict(props)
