"""The synchronous facade over named logs, for scripts."""
from __future__ import annotations

from pybk.client.sync import BookKeeper
from pybk.log.sync import Logs

PW = b"pw"


def test_scripts_write_and_read_a_log_without_asyncio(cluster):
    uri, _ = cluster
    with BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        logs.create("s", password=PW)
        with logs.open_writer("s", password=PW) as w:
            assert w.append(b"a", key=b"k") == 0
            assert w.append_many([b"b", b"c"]) == range(1, 3)
        assert [(r.offset, r.key, r.payload) for r in logs.read("s", batch=2)] == [
            (0, b"k", b"a"), (1, None, b"b"), (2, None, b"c")]
        assert logs.commit("s", "c1", 1) == 1
        assert [(c.name, c.offset, c.lag) for c in logs.cursors("s")] == [("c1", 1, 2)]
        assert [r.payload for r in logs.read("s", cursor="c1")] == [b"b", b"c"]
        assert logs.list() == ["s"] and logs.end_offset("s") == 3
        logs.delete("s", password=PW)
        assert logs.list() == []
