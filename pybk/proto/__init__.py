"""Generated protobuf and gRPC code for the bookie wire protocol (see bookie.proto)."""
from . import bookie_pb2 as pb
from . import bookie_pb2_grpc as rpc

__all__ = ["pb", "rpc"]
