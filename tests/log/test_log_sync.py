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


def test_a_flushed_writer_that_goes_quiet_leaves_every_record_readable(cluster):
    """A sync writer's event loop runs only during its calls, so the client's idle timer that
    tells bookies the LAC never fires between them (here it would wait an hour): flush tells them,
    and another client reads to the end while the writer holds the log open."""
    from pybk.client.bookkeeper import ClientOptions

    uri, _ = cluster
    with BookKeeper.connect(uri, ClientOptions(explicit_lac_delay=3600)) as bk, BookKeeper.connect(uri) as other:
        logs = Logs(bk)
        logs.create("quiet", password=PW)
        with logs.open_writer("quiet", password=PW) as w:
            w.append_many([b"a", b"b"])
            w.append(b"c")
            w.flush()
            assert Logs(other).end_offset("quiet") == 3
            assert [r.payload for r in Logs(other).read("quiet")] == [b"a", b"b", b"c"]
