"""Transports built on proven protocol engines (ngh2_server: gRPC over libnghttp2's HTTP/2)."""
