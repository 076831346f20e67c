"""``logDir``: each server also logs to its own rotating file there, as RocketMQ writes ``broker.log`` and
``namesrv.log`` under ``~/logs/rocketmqlogs`` (128 MiB a file, 10 kept: its logback defaults).

In ``mqlake up`` both servers share the process: the NameServer's records (``broker.namesrv.*``) go to
namesrv.log, everything else to broker.log.
"""

from __future__ import annotations

import logging
from logging.handlers import RotatingFileHandler
from pathlib import Path

MAX_BYTES = 128 * 1024 * 1024
BACKUP_COUNT = 10
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
NAMESRV_LOGGER = "broker.namesrv"


def _is_namesrv(record: logging.LogRecord) -> bool:
    return record.name == NAMESRV_LOGGER or record.name.startswith(NAMESRV_LOGGER + ".")


def add_log_files(log_dir: Path, *, broker: bool, namesrv: bool) -> list[RotatingFileHandler]:
    """Attach ``broker.log`` and/or ``namesrv.log`` under ``log_dir`` to the root logger; returns the handlers."""
    log_dir = Path(log_dir).expanduser()
    log_dir.mkdir(parents=True, exist_ok=True)
    handlers = []
    for name, wanted, keep in (("broker.log", broker, lambda r: not namesrv or not _is_namesrv(r)),
                               ("namesrv.log", namesrv, _is_namesrv if broker else lambda r: True)):  # fmt: skip
        if not wanted:
            continue
        h = RotatingFileHandler(log_dir / name, maxBytes=MAX_BYTES, backupCount=BACKUP_COUNT, encoding="utf-8")
        h.setFormatter(logging.Formatter(FORMAT))
        h.addFilter(keep)
        logging.getLogger().addHandler(h)
        handlers.append(h)
    return handlers
