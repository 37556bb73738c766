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
