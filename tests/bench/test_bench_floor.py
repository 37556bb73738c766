"""`pybk bench floor` runs its bare servers in every variant, answers every message and cleans up."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

_VARIANTS = [
    [],
    ["--client", "aio-gather"],
    ["--client", "aio-iterator"],
    ["--client", "aio-unary"],
    ["--client", "ngh2"],
    ["--client", "sync"],
    ["--client", "sync-unary"],
    ["--server", "sync"],
    ["--server", "aio-context"],
    ["--server", "ngh2"],
    ["--client", "ngh2", "--server", "ngh2"],
    ["--client", "sync", "--server", "sync"],
    ["--rate", "500"],
    ["--client", "ngh2", "--server", "ngh2", "--rate", "500"],
    ["--fsync", "dsync"],
    ["--fsync", "none"],
    ["--gc-threshold", "50000"],
    ["--grpc-option", "grpc.enable_retries=0", "--grpc-option", "grpc.http2.write_buffer_size=0"],
    *[pytest.param(variant, marks=pytest.mark.skipif(importlib.util.find_spec("uvloop") is None,
                                                     reason="uvloop is not installed"))
      for variant in (["--loop", "uvloop"], ["--server-loop", "uvloop"])],
]


def _floor(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pybk.cli", "bench", "floor", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("variant", _VARIANTS, ids=lambda v: " ".join(v) or "baseline")
def test_floor_bench_variant_answers_every_message_and_leaves_no_server(tmp_path, variant, child_processes):
    out = _floor("--entries", "50", "--dir", str(tmp_path), "-o", "json", *variant)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["entries"] == result["answered"] == 50
    assert result["servers"] == 3 and result["ack_quorum"] == 2
    flags, options = {}, {}
    for flag, value in zip(variant[::2], variant[1::2]):
        if flag == "--grpc-option":
            name, _, number = value.partition("=")
            options[name] = int(number)
        else:
            flags[flag] = value
    assert result["client"] == flags.get("--client", "aio") and result["server"] == flags.get("--server", "aio")
    assert result["loop"] == flags.get("--loop", "asyncio") and result["fsync"] == flags.get("--fsync", "fdatasync")
    assert result["server_loop"] == flags.get("--server-loop", result["loop"])
    assert result["grpc_options"] == options
    assert result["gc_threshold"] == (int(flags["--gc-threshold"]) if "--gc-threshold" in flags else None)
    assert result["rate"] == (float(flags["--rate"]) if "--rate" in flags else None)
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["p999_ms"]
    assert result["client_cpu_us"] > 0
    assert list(tmp_path.iterdir()) == []  # the temp dir with the servers' files is gone


def test_floor_bench_refuses_an_impossible_quorum(child_processes):
    out = _floor("--ack-quorum", "4", timeout=60)
    assert out.returncode == 2 and "--ack-quorum" in out.stderr


@pytest.mark.parametrize("args", [["--rate", "0"], ["--rate", "100", "--client", "sync"]], ids=["zero", "sync client"])
def test_floor_bench_refuses_a_pace_it_cannot_keep(args, child_processes):
    out = _floor(*args, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("pybk bench floor: --rate must be above 0")


def test_floor_bench_refuses_a_grpc_option_without_a_value(child_processes):
    out = _floor("--grpc-option", "grpc.enable_retries", timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("pybk bench floor: --grpc-option 'grpc.enable_retries' is not NAME=VALUE")
