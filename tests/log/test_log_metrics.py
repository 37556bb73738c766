"""Named logs' metrics: what a writer counts, and the bound on the `log` label's values."""
from __future__ import annotations

from prometheus_client import REGISTRY

from pybk.client import BookKeeper
from pybk.log import Logs, WriterOptions, metrics

PW = b"log-password"


def test_logs_past_the_limit_share_one_label_value(monkeypatch):
    labels = metrics.LogLabels(limit=2)
    assert [labels(n) for n in ("a", "b", "c", "a", "d")] == ["a", "b", metrics.OTHER, "a", metrics.OTHER]
    assert labels.named == {"a", "b"}
    monkeypatch.setenv(metrics.ENV_MAX_LOGS, "1")
    from_env = metrics.LogLabels()
    assert [from_env(n) for n in ("x", "y")] == ["x", metrics.OTHER]


async def test_a_writer_counts_records_bytes_entries_rolls_and_fill(cluster):
    uri, _ = cluster
    value = metrics.label("metered")

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name, {"log": value}) or 0.0
    fills = REGISTRY.get_sample_value("pybk_log_batch_fill_ratio_count") or 0.0
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("metered", password=PW)
        async with await logs.open_writer("metered", password=PW, options=WriterOptions(batch_bytes=1000)) as w:
            await w.append_many([b"x" * 96] * 100)   # 100 B each with its length (uniform entries of at most 1000 B)
            await w.roll()
            await w.append(b"y")
    assert sample("pybk_log_appended_records_total") == 101
    entries = sample("pybk_log_entries_total")
    assert 11 <= entries <= 14
    # records and entry headers ("y" alone is a uniform entry too: 1 B and its length)
    assert sample("pybk_log_appended_bytes_total") == 100 * 100 + 5 + 40 * entries
    assert sample("pybk_log_rolls_total") == 1
    assert REGISTRY.get_sample_value("pybk_log_batch_fill_ratio_count") - fills == entries
