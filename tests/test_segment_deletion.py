"""Tiered segments deleted on a closed store (store/segment_deletion.py): the store's own deletion, no recovery."""

from __future__ import annotations

import pytest

from store.checkpoint import StoreLockedError, abort_file
from store.message_store import MessageStore
from store.retention import SegmentManifest, claimer_id
from store.segment_deletion import delete_tiered_closed
from tests.helpers import make_config
from tests.test_retention import Filled, manifest_states, segment_names

pytestmark = pytest.mark.unit


def test_tiered_prefix_of_a_closed_store_is_deleted_and_the_store_reopens_consistent(tmp_path):
    cfg = make_config(tmp_path, file_reserved_time=0, clean_file_forcibly_enable=False)
    f = Filled(cfg, segments=4)
    try:
        f.store.clean_expired_files()  # seals expire (reserved time 0)
        m = SegmentManifest(cfg.store_path_root_dir)
        owner = claimer_id("closed-delete")
        assert [e.base_offset for e in m.claim(owner, limit=3)] == f.sealed[:3]
        m.mark_tiered(f.sealed[0], owner)
        m.mark_tiered(f.sealed[1], owner)
        m.mark_quarantined(f.sealed[2], owner, "planted")
        files = segment_names(cfg.commitlog_dir)
        cq_files_before = sorted(p for p in cfg.consume_queue_dir.rglob("*") if p.is_file())

        with pytest.raises(StoreLockedError):  # a running store holds the lock: nothing is touched
            delete_tiered_closed(cfg)
        f.store.shutdown()

        abort_file(cfg.store_path_root_dir).touch()  # as after a crash: only recovery knows what was dispatched
        assert delete_tiered_closed(cfg) is None
        assert segment_names(cfg.commitlog_dir) == files
        abort_file(cfg.store_path_root_dir).unlink()

        assert delete_tiered_closed(cfg) == f.sealed[:2]  # the tiered prefix, up to the quarantined segment
        assert segment_names(cfg.commitlog_dir) == files[2:]
        states = manifest_states(cfg.store_path_root_dir)
        assert (states[f.sealed[0]], states[f.sealed[1]], states[f.sealed[2]]) == ("deleted", "deleted", "quarantined")
        cq_files_after = sorted(p for p in cfg.consume_queue_dir.rglob("*") if p.is_file())
        assert set(cq_files_after) < set(cq_files_before), "ConsumeQueue files wholly below the new minimum go too"

        f.store = MessageStore(make_config(tmp_path, file_reserved_time=0)).start()
        assert f.store.commitlog.min_offset == f.sealed[2]
        f.assert_reads(f.sealed[2])  # every queue starts at its first message in the remaining log, data intact
    finally:
        f.close()
