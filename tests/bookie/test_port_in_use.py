"""A bookie refuses to start on a port another bookie already serves."""
from __future__ import annotations

from pybk.local.bookie import BookieProcess


def test_second_bookie_on_the_same_port_refuses_to_start(bookies, tmp_path):
    first, = bookies(1, metadata_uri=None)
    second = BookieProcess(tmp_path / "second", port=first.port)
    second.start(wait=False)
    try:
        assert second.exit_code(60) != 0
        assert f"cannot listen for gRPC on 127.0.0.1:{first.port}" in second.log_tail()
        assert not (tmp_path / "second" / "journal").exists()  # it failed before touching its dirs
    finally:
        second.kill()
    assert first.is_ready()


def test_a_first_start_that_lost_its_free_port_moves_to_new_ports(tmp_path, child_processes):
    import socket
    proc = BookieProcess(tmp_path / "b")
    taken = proc.port
    with socket.create_server(("127.0.0.1", taken)):  # another process got there first
        proc.start(wait=False)
        try:
            proc.wait_started(60)
            assert proc.port != taken and proc.bookie_id == f"127.0.0.1:{proc.port}" and proc.is_ready()
            assert "cannot listen for gRPC" in proc.log_path.read_text()
        finally:
            proc.kill()
