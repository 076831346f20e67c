"""The RocketMQ 5 gRPC endpoint (``apache.rocketmq.v2.MessagingService``): a proxy in local mode inside the broker.

``server`` runs the grpc.aio server on the broker's event loop; ``service`` answers the RPCs; ``pop`` holds the
receive/ack (pop) state and its revive log; ``convert`` maps v2 messages to and from CommitLog records;
``receipt`` encodes receipt handles; ``status`` holds the v2 status codes.  The stubs in ``v2/`` are generated at
install time (``tools/gen_grpc_stubs.py``, docs/grpc.md).
"""

import os

# gRPC core's fork handlers restart its poller threads in a forked child; a child that then closes its
# descriptors before exec (subprocess with preexec_fn/close_fds, as Spark's launcher and our tests do) aborts on
# epoll_wait(EBADF).  Nothing here forks to keep using gRPC, so the handlers are off unless the user says so.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
