"""Apache RocketMQ 5.4.0's controller as a three-node DLedger group on loopback (``tests.peers.ControllerCluster``):
the groundwork for controller mode, where mqlake's brokers register with it, heartbeat to it and follow its
elections (docs/ha.md, "Controller mode: plan")."""

from __future__ import annotations

import pytest

from tests.helpers import wait_until
from tests.peers import ControllerCluster


@pytest.mark.integration
def test_three_controllers_elect_one_leader_that_every_node_names(tmp_path) -> None:
    with ControllerCluster(tmp_path / "controllers") as cluster:
        views: list[dict[str, str]] = []

        def agreed() -> bool:
            answers = [cluster.metadata_info(addr) for addr in cluster.addrs]
            views[:] = [v for v in answers if v is not None]
            if len(views) < len(answers):
                return False
            leaders = {(v.get("controllerLeaderId"), v.get("controllerLeaderAddress")) for v in views}
            return len(leaders) == 1 and next(iter(leaders))[0] in cluster.ids

        wait_until(agreed, 60, what="the three controllers to agree on a leader")
        leader_id, leader_addr = views[0]["controllerLeaderId"], views[0]["controllerLeaderAddress"]
        assert leader_addr == cluster.addrs[cluster.ids.index(leader_id)]
        # only the leader says it leads
        assert [v["isLeader"] for v in views] == ["true" if n == leader_id else "false" for n in cluster.ids]
        # and RocketMQ's own admin command, asked of a follower, names the same leader and the whole group
        follower = cluster.addrs[(cluster.ids.index(leader_id) + 1) % len(cluster.ids)]
        shown = cluster.metadata(follower)
        assert (shown["ControllerLeaderId"], shown["ControllerLeaderAddress"]) == (leader_id, leader_addr)
        assert shown["ControllerGroup"] == ControllerCluster.GROUP
        assert sorted(shown["Peer"].split(";")) == sorted(f"{n}:{a}" for n, a in zip(cluster.ids, cluster.addrs,
                                                                                       strict=True))  # fmt: skip
