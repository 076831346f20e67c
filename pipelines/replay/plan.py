"""What a replay run plans per source queue, whichever engine selected the rows (job.py, local.py)."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.replay.progress import QueueKey

SOURCE_QUEUE = ["broker_name", "topic", "queue_id"]  # the columns naming a source queue


@dataclass
class QueuePlan:
    broker: str  # the source queue's broker (a queue id means a queue of one broker)
    topic: str
    queue_id: int
    rows: int
    min_offset: int
    max_offset: int
    already_done: int  # rows at or below the recorded progress
    resume_after: int  # the recorded progress (-1: none)

    @property
    def key(self) -> QueueKey:
        return (self.broker, self.topic, self.queue_id)
