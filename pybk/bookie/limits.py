"""What one client may hold of a bookie's memory: the caps of its gRPC port and its streams."""
from __future__ import annotations

from dataclasses import dataclass

from pybk.config import option_field
from pybk.proto.wire import MESSAGE_HEADROOM


@dataclass(frozen=True)
class Limits:
    """What one client may hold of a bookie's memory (the bookie's options of the same names).
    A max_message_size of 0 is the largest entry plus headroom (`message_limit`)."""

    max_message_size: int = option_field("max_message_size")
    max_add_bytes_in_flight: int = option_field("max_add_bytes_in_flight")
    max_add_bytes_in_flight_per_connection: int = option_field("max_add_bytes_in_flight_per_connection")
    max_read_buffer_bytes: int = option_field("max_read_buffer_bytes")
    max_client_memory: int = option_field("max_client_memory")
    read_stream_timeout: float = option_field("read_stream_timeout")


def message_limit(max_message_size: int, max_entry_size: int) -> int:
    """The largest gRPC message: as configured, or (0) the largest entry plus headroom."""
    return max_message_size or max_entry_size + MESSAGE_HEADROOM
