"""The sizes a store was written with, read off its files: what opening a store needs when no broker.conf is
given (the tier job's deletion, the index verification); the store refuses files of another size."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from store.config import MessageStoreConfig
from store.errors import MQLakeError
from store.format import units


class StoreSizeError(MQLakeError, ValueError):
    """The store's file sizes cannot be read off its files."""


def infer_store_config(store_dir: Path) -> MessageStoreConfig:
    """The sizes a store was written with, read off its files (the store refuses files of another size)."""
    root = Path(store_dir)
    # Opened only to delete: a CRC pass over the last segments would cost seconds per GiB and decide nothing.
    values: dict = {"store_path_root_dir": root, "check_crc_on_recover": False}
    segments = sorted(_non_empty(root / "commitlog", "*", units.is_offset_file_name))
    if segments:
        values["mapped_file_size_commit_log"] = segments[0].stat().st_size
    cq = next(_non_empty(root / "consumequeue", "*/*/*", units.is_offset_file_name), None)
    if cq is not None:
        values["mapped_file_size_consume_queue"] = cq.stat().st_size
    index = sorted(_non_empty(root / "index", "*", units.is_index_file_name))
    if index:
        # The header counts used slots, not configured ones, so the size is all there is to go by:
        # 40 + 4 * slots + 20 * entries, with RocketMQ's entries = 4 * slots (5M / 20M by default).
        size = index[0].stat().st_size
        per_slot = units.index_file_size(1, 4) - units.index_file_size(0, 0)
        slots, rest = divmod(size - units.index_file_size(0, 0), per_slot)
        if rest:
            raise StoreSizeError(
                f"{index[0]}: size {size} is not maxIndexNum = 4 x maxHashSlotNum; pass the broker's config "
                f"(--broker-conf) so the store can be opened to delete tiered segments"
            )
        values["max_hash_slot_num"], values["max_index_num"] = slots, 4 * slots
    elif segments:
        values["message_index_enable"] = False  # a store with messages and no IndexFile never indexed
    return MessageStoreConfig(**values)


def _non_empty(directory: Path, pattern: str, is_name: Callable[[str], bool]) -> Iterator[Path]:
    """The non-empty files under ``directory`` matching ``pattern`` whose name ``is_name`` accepts."""
    return (p for p in directory.glob(pattern) if is_name(p.name) and p.is_file() and p.stat().st_size > 0)
