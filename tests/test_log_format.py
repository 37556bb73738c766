"""Structured logs: with `--log-format json` every line a process writes is one JSON object with
timestamp, level, logger and message, plus the context the line is about."""
from __future__ import annotations

import datetime
import json
import logging
import subprocess
import sys

from pybk.client.sync import BookKeeper
from pybk.logformat import JsonFormatter, LogFormat, parse_log_format

LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


def _parse_lines(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "the process wrote nothing"
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return out


def test_every_line_a_bookie_writes_in_json_is_an_object_naming_time_level_logger_message_and_bookie(
        bookies, metadata_uri):
    procs = bookies(3, log_format="json")
    with BookKeeper.connect(metadata_uri) as bk:
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        for i in range(50):
            lh.add_entry(b"entry-%d" % i)
        lh.close()
        assert [e.data for e in bk.open_ledger(lh.ledger_id, password=b"pw").read_entries(0, 49)] == \
            [b"entry-%d" % i for i in range(50)]
    for p in procs:
        assert p.stop() == 0
    for p in procs:
        objects = _parse_lines(p.log_path.read_text())
        for o in objects:
            assert o["timestamp"].endswith("Z")
            assert datetime.datetime.fromisoformat(o["timestamp"]).tzinfo is not None
            assert o["level"] in LEVELS
            assert isinstance(o["logger"], str) and o["logger"]
            assert isinstance(o["message"], str)
            assert o["bookie_id"] == p.bookie_id
        messages = [o["message"] for o in objects]
        assert any(m.startswith(f"bookie {p.bookie_id} serving gRPC") for m in messages)
        assert any(o.get("event") == "ready" for o in objects)
        assert "stopping" in messages


def test_a_bookie_logs_text_lines_by_default(bookies):
    (p,) = bookies(1)
    assert p.stop() == 0
    first = p.log_path.read_text().splitlines()[0]
    assert not first.startswith("{")
    assert " INFO pybk." in first


def test_a_log_line_carries_the_ledger_and_entries_it_is_about_and_the_traceback():
    logger = logging.getLogger("pybk.test")
    try:
        raise OSError("disk gone")
    except OSError:
        record = logger.makeRecord("pybk.test", logging.ERROR, __file__, 1, "read %d:[%d,%d] failed",
                                   (7, 0, 9), sys.exc_info(),
                                   extra={"ledger_id": 7, "entry_range": [0, 9], "bookie": "b-1"})
    line = JsonFormatter().format(record)
    assert "\n" not in line
    o = json.loads(line)
    assert o["message"] == "read 7:[0,9] failed"
    assert (o["ledger_id"], o["entry_range"], o["bookie"]) == (7, [0, 9], "b-1")
    assert o["level"] == "ERROR" and o["logger"] == "pybk.test"
    assert o["exception"].startswith("Traceback") and "OSError: disk gone" in o["exception"]


def test_log_format_names_the_two_formats():
    assert parse_log_format(" JSON ") is LogFormat.JSON
    assert parse_log_format("text") is LogFormat.TEXT
    try:
        parse_log_format("xml")
    except ValueError as e:
        assert str(e) == "not a log format: 'xml' (use text or json)"
    else:
        raise AssertionError("xml was accepted")


def test_an_unknown_log_format_is_refused_at_start_naming_it(tmp_path, child_processes):
    proc = subprocess.run([sys.executable, "-m", "pybk.cli", "bookie", "--log-format", "xml",
                           "--journal-dir", str(tmp_path / "j"), "--ledger-dir", str(tmp_path / "l")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == ("pybk bookie: --log-format: bad value for log_format: "
                                           "not a log format: 'xml' (use text or json)")


def test_a_bookie_that_refuses_to_start_says_why_in_one_json_line(tmp_path, child_processes):
    proc = subprocess.run([sys.executable, "-m", "pybk.cli", "bookie", "--log-format", "json",
                           "--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", str(tmp_path / "missing.key"),
                           "--journal-dir", str(tmp_path / "j"), "--ledger-dir", str(tmp_path / "l"),
                           "--port", "0", "--http-port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    objects = _parse_lines(proc.stderr)
    assert objects[-1]["level"] == "CRITICAL"
    assert objects[-1]["message"].startswith("pybk bookie: refusing to start: ")
    assert "tls_cert is set but tls_ca is not" in objects[-1]["message"]
