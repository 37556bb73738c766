"""Bookie options: flags override PYBK_* environment variables, which override the YAML file."""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from pybk import config
from pybk.bookie.main import add_arguments
from pybk.bookie.settings import BookieSettings
from pybk.config import BOOKIE, ConfigError, parse_size, resolve


def parse(argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_flags_override_env_override_yaml_override_defaults(tmp_path):
    cfg_file = tmp_path / "bookie.yaml"
    cfg_file.write_text("journal_dir: /yaml/j\nledger-dir: [/yaml/l1, /yaml/l2]\nport: 4000\nzone: yz\n")
    args = parse(["--config", str(cfg_file), "--port", "5000"])
    cfg = resolve(args, BOOKIE, environ={"PYBK_ZONE": "envzone", "PYBK_PORT": "4500",
                                         "PYBK_JOURNAL_FSYNC": "false"})
    assert cfg["port"] == 5000 and cfg["zone"] == "envzone" and cfg["journal_dir"] == "/yaml/j"
    assert cfg["ledger_dir"] == ["/yaml/l1", "/yaml/l2"] and cfg["journal_fsync"] is False
    assert cfg["journal_group_max_bytes"] == 16 * 1024 * 1024 and cfg["http_port"] == 8000


def test_missing_and_bad_settings_name_the_option():
    with pytest.raises(ConfigError, match="journal_dir"):
        resolve(parse(["--ledger-dir", "/l"]), BOOKIE, environ={})
    with pytest.raises(ConfigError, match="port"):
        resolve(parse(["--journal-dir", "/j", "--ledger-dir", "/l", "--port", "x"]), BOOKIE, environ={})
    assert parse_size("64KiB") == 65536 and parse_size("1GB") == 10 ** 9


def test_help_explains_every_option(child_processes):
    out = subprocess.run([sys.executable, "-m", "pybk.cli", "bookie", "--help"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    for opt in BOOKIE.options:
        assert opt.flag in out


def _connections(**options):
    from pybk.bookie.main import connection_limits
    settings = config.settings(BookieSettings, parse(["--journal-dir", "/j", "--ledger-dir", "/l",
                               *(f"--{k.replace('_', '-')}={v}" for k, v in options.pop("flags", {}).items())]),
                               BOOKIE, environ={})
    return connection_limits(settings.connections, options["open_files"])


def test_the_connection_limit_leaves_the_reserved_descriptors_to_the_bookie():
    from pybk.bookie.main import DescriptorError
    assert _connections(open_files=1 << 20).max_connections == 4096  # the default, well within the limit
    assert _connections(open_files=1600).max_connections == 576      # 1600 less the 1024 reserved
    assert _connections(open_files=1600, flags={"max_connections": 0}).max_connections == 576
    assert _connections(open_files=5000, flags={"max_connections": 0, "reserved_descriptors": 200}
                        ).max_connections == 4800
    with pytest.raises(DescriptorError, match=r"^the open-files limit \(1024, RLIMIT_NOFILE.*leaves 0 descriptors"):
        _connections(open_files=1024)
    limits = _connections(open_files=1 << 20, flags={"idle_timeout": 2, "keepalive_interval": 0})
    assert (limits.max_connections_per_peer, limits.handshake_timeout, limits.idle_timeout) == (512, 10, 2)
    assert limits.tick == 0.5 and _connections(open_files=1 << 20).tick == 1.0
