"""The bookie server accepts the keepalive pings its clients send, so idle connections stay up."""
from pybk.bookie import client, service


def test_server_permits_the_client_keepalive_pings():
    srv, cli = dict(service.GRPC_OPTIONS), dict(client.GRPC_OPTIONS)
    assert srv["grpc.keepalive_permit_without_calls"] == 1
    assert srv["grpc.http2.min_recv_ping_interval_without_data_ms"] <= cli["grpc.keepalive_time_ms"]
