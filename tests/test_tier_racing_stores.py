"""Two stores under one broker name, tiered into one lake at the same moment: the check for another store's
rows runs before each commit, so two runs whose checks both come before either commit would both pass it.
The test interleaves them deterministically: store B's whole run happens between store A's check and A's
commit (a hook on the check), on real stores, real Spark and a real Delta table."""

from __future__ import annotations

from collections import Counter

import pytest

from lake import broker_names, tables
from lake import delta as lk
from pipelines.compaction.job import tier
from store.retention import SegmentManifest, SegmentState
from tests.fixtures_spark import write_store
from tests.test_tier import assert_rows_are, sealed, sealed_expected, table_rows


@pytest.mark.spark
@pytest.mark.expected_errors(r"quarantining segment .* from another store")
def test_a_store_committing_between_anothers_check_and_commit_wins_the_other_is_taken_out(
    spark, tmp_path, monkeypatch
):
    a, b = write_store(tmp_path / "a"), write_store(tmp_path / "b")  # same topics, queue ids and offsets
    lake = tmp_path / "lake"
    messages = tables.table_uri(lake, tables.MESSAGES)
    segments = sealed(a.root)[:2]
    assert segments == sealed(b.root)[:2]
    check = broker_names.refuse_rows_of_another_store
    b_reports: list = []
    calls: list[int] = []

    def b_tiers_after_as_check(*args, **kwargs):
        calls.append(1)
        looked_at = check(*args, **kwargs)
        if len(calls) == 1:  # A's first check: B's whole run (its checks pass through here) before A commits
            b_reports.append(tier(b.root, lake, spark=spark, file_reserved_time=0, max_segments=2))
        return looked_at

    monkeypatch.setattr(broker_names, "refuse_rows_of_another_store", b_tiers_after_as_check)
    with pytest.raises(broker_names.BrokerNameError, match=r"raced another store's and was taken out again"):
        tier(a.root, lake, spark=spark, file_reserved_time=0, max_segments=2)

    # B committed first and keeps its rows; A's commit came after and left again: every row once, B's
    [b_report] = b_reports
    assert [s.segment for s in b_report.by_state("tiered")] == segments
    assert_rows_are(table_rows(spark, lake), sealed_expected(b, segments))
    rows = lk.to_arrow(messages)
    keys = Counter(zip(*(rows.column(c).to_pylist() for c in ("broker_name", "topic", "queue_id", "queue_offset")),
                       strict=True))  # fmt: skip
    assert keys and max(keys.values()) == 1
    # A's commit is in the log, between B's and its own withdrawal; time travel to it still reads both stores
    history = {c["version"]: c for c in lk.open_table(messages).history()}
    [a_commit] = [v for v, c in history.items() if c.get("mqlake.tier.segments") and
                  c.get("mqlake.tier.store") != b_report.store_id]  # fmt: skip
    [b_commit] = [v for v, c in history.items() if c.get("mqlake.tier.store") == b_report.store_id
                  and c.get("mqlake.tier.segments")]  # fmt: skip
    withdrawn = [v for v, c in history.items() if c.get("mqlake.tier.withdrawn") == str(a_commit)]
    assert b_commit < a_commit and withdrawn == [a_commit + 1] == [lk.open_table(messages).version()]
    assert lk.to_arrow(messages, version=a_commit).num_rows == 2 * rows.num_rows
    # A's segments are quarantined with the reason and kept in its store; B's are tiered
    a_states = {e.file_name: e for e in SegmentManifest(a.root).entries() if e.file_name in segments}
    assert {e.state for e in a_states.values()} == {SegmentState.QUARANTINED}
    assert all("raced another store's" in e.note for e in a_states.values()), a_states
    assert all((a.commitlog / s).exists() for s in segments)
    b_states = {e.state for e in SegmentManifest(b.root).entries() if e.file_name in segments}
    assert b_states <= {SegmentState.TIERED, SegmentState.DELETED}, b_states
