"""pybk: replicated, append-only ledger storage in the model of Apache BookKeeper."""
import os

__version__ = "0.1.0"

# gRPC's fork support installs fork handlers that, when another thread is inside gRPC at that
# moment, are skipped with the child left in a broken state; a subprocess started then (Spark's
# JVM launcher forks to run its preexec_fn) dies before it execs. pybk never uses gRPC in a forked
# child (it starts processes with exec), so it runs without those handlers unless told otherwise.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
