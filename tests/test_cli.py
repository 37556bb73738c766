"""The `pybk` command's processes: what they set up before a subcommand's module is imported."""
from __future__ import annotations

import os
import subprocess
import sys

THREADS_AFTER_NUMPY = "import pybk.cli, numpy, os; print(len(os.listdir('/proc/self/task')))"


def _threads(env: dict[str, str]) -> int:
    out = subprocess.run([sys.executable, "-c", THREADS_AFTER_NUMPY], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return int(out.stdout)


def test_a_pybk_process_imports_numpy_without_openblas_threads():
    """OpenBLAS starts a spinning thread per core at import; pybk's small arrays never use them."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert _threads(env) == 1


def test_a_thread_count_the_user_set_for_openblas_is_kept():
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    assert _threads(env) == 2
