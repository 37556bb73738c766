"""`pybk shell log` on bookies that serve TLS and check tokens: each action needs the role
docs/security.md gives it, and a refusal is one clear line."""
from __future__ import annotations

import json
import os
import subprocess
import sys


def shell(uri: str, pki, role: str | None, *args, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYBK_")}
    env.update({k: v for k, v in pki.client(role).as_env().items()})
    return subprocess.run([sys.executable, "-m", "pybk.cli", "shell", "log", *map(str, args), "--metadata-uri", uri],
                          input=stdin, capture_output=True, env=env, timeout=120)


def test_log_commands_need_their_roles(bookies, metadata_uri, pki, tmp_path):
    """Slow: ten shell processes over TLS (2-3 s apiece on a busy machine)."""
    bookies(3, **pki.bookie_options())
    pw = tmp_path / "pw"
    pw.write_text("secured-log\n")
    refused = shell(metadata_uri, pki, "writer", "create", "audit")
    assert refused.returncode == 1 and "without a password" in refused.stderr.decode()
    assert shell(metadata_uri, pki, "writer", "create", "audit", "--password-file", pw).returncode == 0
    res = shell(metadata_uri, pki, "writer", "append", "audit", "--password-file", pw, "--print-offsets",
                stdin=b"a\nb\n")
    assert res.returncode == 0 and res.stdout == b"0\n1\n", res.stderr.decode()

    res = shell(metadata_uri, pki, "reader", "read", "audit")
    assert res.returncode == 0, res.stderr.decode()
    assert [json.loads(line)["payload"] for line in res.stdout.splitlines()] == ["a", "b"]
    denied = shell(metadata_uri, pki, "reader", "append", "audit", "--password-file", pw, stdin=b"c\n")
    last = denied.stderr.decode().splitlines()[-1]
    assert denied.returncode == 1 and last.startswith("pybk shell log: error: ") and "add needs role writer" in last
    anonymous = shell(metadata_uri, pki, None, "read", "audit")
    last = anonymous.stderr.decode().splitlines()[-1]
    assert anonymous.returncode == 1 and last.startswith("pybk shell log: error: ") and "UNAUTHENTICATED" in last

    not_admin = shell(metadata_uri, pki, "writer", "delete", "audit", "--force")
    assert not_admin.returncode == 1 and "needs the admin role" in not_admin.stderr.decode()
    assert shell(metadata_uri, pki, "admin", "delete", "audit", "--force").returncode == 0
    assert json.loads(shell(metadata_uri, pki, "reader", "list", "-o", "json").stdout) == []
