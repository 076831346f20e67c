"""Generated at install time by tools/gen_grpc_stubs.py (``make install``): ``definition_pb2``, ``service_pb2``
and ``service_pb2_grpc`` for ``apache.rocketmq.v2``, from the descriptors of the pinned rocketmq-python-client."""
