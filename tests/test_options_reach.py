"""Every option of the table reaches the component that uses it: each is set to a value other
than its default and read back from the running process (a bookie's and autorecovery's
GET .../config report the option objects their components hold), or, for the operator, which
needs a Kubernetes API server, from what its start-up wiring hands kopf and the handlers."""
from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import subprocess
import sys
from pathlib import Path

import kopf
import yaml

from pybk import config
from pybk.config import AUTORECOVERY, BOOKIE, OPERATOR, Process
from pybk.local.autorecovery import AutoRecoveryProcess
from pybk.local.bookie import BookieProcess
from pybk.local.process import free_port
from pybk.security.ca import CertificateAuthority, write_private

HOST = "127.0.0.2"  # a loopback address other than the default host


def expected(process: Process, values: dict) -> dict:
    """The values as the process holds them (converted by the option's type), checked to differ
    from the defaults and to cover every option of the process."""
    assert sorted(values) == sorted(o.name for o in process.options), "give every option a value"
    out = {}
    for name, value in values.items():
        opt = process.option(name)
        converted = opt.convert(value)
        assert converted != opt.value_in({}), f"{name}: {value!r} is its default"
        out[name] = converted
    return out


def security_files(directory: Path) -> dict:
    """TLS files for HOST under the name pybk-bookie, an admin token and an auth file taking it."""
    files = CertificateAuthority.create().write_identity(directory / "tls", "pybk-bookie", hosts=("pybk-bookie", HOST))
    token = secrets.token_urlsafe(24)
    token_file = write_private(directory / "admin.token", token.encode())
    auth_file = directory / "auth.yaml"
    auth_file.write_text(yaml.safe_dump({"tokens": [{"name": "admin", "role": "admin", "token_file": str(token_file)}]}))
    return {"tls_cert": str(files.cert), "tls_key": str(files.key), "tls_ca": str(files.ca),
            "tls_server_name": "pybk-bookie", "token_file": str(token_file), "auth_file": str(auth_file),
            "tls_client_auth": "true"}


def common(directory: Path) -> dict:
    settings = directory / "settings.yaml"
    settings.write_text("{}\n")
    return {"config": str(settings), "log_level": "DEBUG", "log_format": "json", "event_loop": "asyncio"}


RECOVERY = {"lost_bookie_delay": "31", "audit_interval": "1801", "open_ledger_grace": "21", "ledger_password": "pw",
            "replication_batch": "1001", "parallel_ledgers": "2", "parallel_runs": "3", "poll_interval": "0.75",
            "job_gc_interval": "301", "job_gc_grace": "3601"}


def test_every_bookie_option_reaches_the_running_bookie(tmp_path, metadata_uri, child_processes):
    port, http_port = free_port(HOST), free_port(HOST)
    values = {
        **common(tmp_path), **security_files(tmp_path), **RECOVERY,
        "metadata_uri": metadata_uri, "host": HOST, "bookie_id": f"bookie-{port}", "port": str(port),
        "http_port": str(http_port), "journal_dir": str(tmp_path / "j"), "ledger_dir": str(tmp_path / "l"),
        "zone": "z1", "rack": "r1", "high_water_mark": "0.99", "low_water_mark": "0.98", "disk_capacity": "10GiB",
        "disk_check_interval": "2.5", "journal_group_wait": "0.002", "journal_group_max_bytes": "8MiB",
        "journal_inline_bytes": "32KiB", "journal_max_file_size": "128MiB", "journal_fsync": "false",
        "journal_prealloc_size": "8MiB", "accept_journal_loss": "true", "rebuild_index": "true",
        "checkpoint_interval": "45", "checkpoint_bytes": "64MiB", "max_write_cache_bytes": "512MiB",
        "entrylog_max_file_size": "512MiB", "entrylog_direct_io": "false", "max_entry_size": "4MiB", "max_message_size": "12MiB",
        "max_add_bytes_in_flight": "128MiB", "max_add_bytes_in_flight_per_connection": "32MiB",
        "max_read_buffer_bytes": "32MiB", "max_client_memory": "256MiB", "read_stream_timeout": "20",
        "max_connections": "100", "max_connections_per_peer": "50", "reserved_descriptors": "512",
        "handshake_timeout": "5", "idle_timeout": "200", "keepalive_interval": "30", "keepalive_timeout": "10",
        "gc_interval": "300", "scrub_interval": "3600", "compaction_threshold": "0.4", "registration_ttl": "7",
        "autorecovery": "true", "open_http_paths": "/heartbeat,/api/v1/bookie/is_ready",
    }
    want = expected(BOOKIE, values)
    want["open_http_paths"] = ["/heartbeat,/api/v1/bookie/is_ready"]
    want["ledger_password"] = ["(set)"]
    fixed = ("host", "port", "http_port", "bookie_id", "journal_dir", "ledger_dir", "metadata_uri", "rebuild_index")
    flags = {k: v for k, v in values.items() if k not in fixed}
    bookie = BookieProcess(tmp_path, metadata_uri=metadata_uri, host=HOST, port=port, http_port=http_port,
                           bookie_id=values["bookie_id"], journal_dir=tmp_path / "j", ledger_dirs=[tmp_path / "l"],
                           **flags)
    bookie.start(wait=False)
    try:
        bookie.wait_started(60)
        status, body = bookie.http_get("/api/v1/bookie/config")
        assert status == 200, body
        got = json.loads(body)
    finally:
        bookie.stop()
    want["rebuild_index"] = False  # it served: read back below, where it rebuilds instead
    assert {k: got.get(k) for k in want} == {k: json.loads(json.dumps(v)) for k, v in want.items()}

    rebuilt = subprocess.run([sys.executable, "-m", "pybk.cli", "bookie", "--rebuild-index", "--journal-dir",
                              str(tmp_path / "j"), "--ledger-dir", str(tmp_path / "l")],
                             capture_output=True, text=True, timeout=60)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads(rebuilt.stdout.splitlines()[-1])["event"] == "index_rebuilt"


def test_every_autorecovery_option_reaches_the_running_autorecovery(tmp_path, metadata_uri, child_processes):
    http_port = free_port(HOST)
    values = {**common(tmp_path), **security_files(tmp_path), **RECOVERY, "metadata_uri": metadata_uri,
              "http_port": str(http_port), "http_host": HOST, "name": "recovery-under-test", "no_worker": "true",
              "open_http_paths": "/heartbeat"}
    want = expected(AUTORECOVERY, values)
    want["ledger_password"] = ["(set)"]
    fixed = ("metadata_uri", "http_port", "http_host", "name")
    proc = AutoRecoveryProcess(tmp_path / "autorecovery.log", metadata_uri, name=values["name"], host=HOST,
                               http_port=http_port, **{k: v for k, v in values.items() if k not in fixed})
    proc.start()
    try:
        status, got = proc.http_json("/api/v1/autorecovery/config")
        assert status == 200, got
    finally:
        proc.stop()
    assert {k: got.get(k) for k in want} == {k: json.loads(json.dumps(v)) for k, v in want.items()}


def test_every_operator_option_reaches_kopf_and_the_handlers(tmp_path, monkeypatch):
    from pybk.operator import handlers, kube, main

    values = {**{k: v for k, v in common(tmp_path).items() if k != "event_loop"},
              **{k: v for k, v in security_files(tmp_path).items() if k in {o.name for o in OPERATOR.options}},
              "namespace": "ns1", "default_metadata_uri": "etcd://127.0.0.1:1/pybk", "refresh_interval": "7",
              "audit_interval": "77", "liveness": "http://127.0.0.1:1/healthz", "verbose": "true"}
    want = expected(OPERATOR, values)
    parser = argparse.ArgumentParser()
    main.add_arguments(parser)
    settings = config.settings(main.OperatorSettings, parser.parse_args(
        [a for k, v in values.items() for a in (OPERATOR.option(k).flag, v)]), OPERATOR, {})
    assert config.effective(settings) == {k: list(v) if isinstance(v, list) else v for k, v in want.items()}

    ran: dict = {}

    async def operator(**kwargs) -> None:
        ran.update(kwargs)

    async def connect() -> object:
        return object()
    registry = kopf.OperatorRegistry()
    monkeypatch.setattr(kopf, "operator", operator)
    monkeypatch.setattr(kopf, "get_default_registry", lambda: registry)
    monkeypatch.setattr(kube.Kube, "connect", staticmethod(connect))
    monkeypatch.setattr(handlers, "CONTEXT", None)
    asyncio.run(main._operate(settings))
    assert ran["namespaces"] == ["ns1"] and ran["liveness_endpoint"] == want["liveness"]
    timers = {h.fn.__name__: h.interval for h in registry._spawning.get_all_handlers()}
    assert timers == {"refresh": 7.0, "audit": 77.0, "refresh_log": 7.0}
    ctx = handlers.CONTEXT
    assert ctx.default_metadata_uri == want["default_metadata_uri"]
    assert config.effective(ctx.security) == {k: want[k] for k in config.effective(ctx.security)}
