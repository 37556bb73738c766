"""Every long-running process takes its settings from one set of declarations (pybk/config.py):
flag > PYBK_* environment > YAML file > default, and refuses a PYBK_* variable it does not know or
cannot parse, naming it."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pybk import config
from pybk.bookie.settings import BookieSettings
from pybk.config import (AUTORECOVERY, BOOKIE, COMMON, ELSEWHERE, OPERATOR, PROCESSES, ConfigError, Number,
                         others_settings, parse_bool, parse_log_level, resolve)

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [p.command for p in PROCESSES]


def parse(process: config.Process, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_options(parser, process)
    return parser.parse_args(argv)


def start(command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`pybk COMMAND` with only the given PYBK_* variables set (it is expected to refuse to start)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYBK_")}
    return subprocess.run([sys.executable, "-m", "pybk.cli", command], env={**base, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_option_reference_is_current():
    assert config.REFERENCE.read_text() == config.reference(), \
        "run `python -m pybk.config` and commit docs/options.md"


@pytest.mark.parametrize("process", PROCESSES, ids=COMMANDS)
def test_flag_beats_environment_beats_file_beats_default(process, tmp_path):
    required = {"journal_dir": "/j", "ledger_dir": "/l", "metadata_uri": "etcd://127.0.0.1:1/p"}
    env = {o.variable: required[o.name] for o in process.options if o.required}
    file = tmp_path / "settings.yaml"
    file.write_text("log_level: ERROR\n")

    def level(argv: list[str], environ: dict[str, str]) -> str:
        return resolve(parse(process, ["--config", str(file), *argv]), process, {**env, **environ})["log_level"]

    assert level(["--log-level", "debug"], {"PYBK_LOG_LEVEL": "WARNING"}) == "DEBUG"
    assert level([], {"PYBK_LOG_LEVEL": "WARNING"}) == "WARNING"
    assert level([], {}) == "ERROR"
    file.write_text("{}\n")
    assert level([], {}) == "INFO"


@pytest.mark.parametrize("command", COMMANDS)
def test_unknown_pybk_variable_is_rejected_naming_it(command, child_processes):
    res = start(command, {"PYBK_NO_SUCH_SETTING": "1"})
    assert res.returncode == 2
    assert "PYBK_NO_SUCH_SETTING" in res.stderr.splitlines()[0]


@pytest.mark.parametrize("command, variable, value", [
    ("bookie", "PYBK_PORT", "x"),
    ("bookie", "PYBK_RECOVERY_PARALLEL_LEDGERS", "0"),
    ("autorecovery", "PYBK_RECOVERY_PARALLEL_RUNS", "many"),
    ("operator", "PYBK_OPERATOR_REFRESH_INTERVAL", "soon"),
])
def test_malformed_pybk_variable_is_rejected_naming_it(command, variable, value, child_processes):
    res = start(command, {variable: value})
    assert res.returncode == 2
    assert variable in res.stderr.splitlines()[0]


def test_malformed_variable_is_rejected_even_when_a_flag_overrides_it():
    with pytest.raises(ConfigError, match="^PYBK_LOG_LEVEL: "):
        resolve(parse(OPERATOR, ["--log-level", "INFO"]), OPERATOR, {"PYBK_LOG_LEVEL": "loud"})


def test_another_process_setting_is_left_to_that_process():
    """`pybk local` hands one environment to all its children: a bookie's setting must not stop
    autorecovery, nor reach it."""
    cfg = resolve(parse(AUTORECOVERY, ["--metadata-uri", "etcd://127.0.0.1:2379/pybk"]), AUTORECOVERY,
                  {"PYBK_HTTP_PORT": "8000", "PYBK_REGISTRATION_TTL": "3"})
    assert cfg["http_port"] != 8000
    assert others_settings(AUTORECOVERY, {"PYBK_HTTP_PORT": "8000"}) == {"PYBK_HTTP_PORT": ["pybk bookie"]}


def test_a_variable_no_process_takes_is_refused_with_the_one_meant():
    with pytest.raises(ConfigError) as err:
        resolve(parse(AUTORECOVERY, []), AUTORECOVERY, {"PYBK_REGISTRATON_TTL": "3"})
    assert str(err.value).startswith("PYBK_REGISTRATON_TTL: no pybk process takes this setting")
    assert "did you mean PYBK_REGISTRATION_TTL?" in str(err.value)


@pytest.mark.parametrize("process", PROCESSES, ids=COMMANDS)
def test_variables_read_elsewhere_are_accepted(process):
    argv = ["--journal-dir", "/j", "--ledger-dir", "/l"] if process is BOOKIE else []
    resolve(parse(process, argv), process, dict.fromkeys(ELSEWHERE, "x"))


def test_every_pybk_variable_the_code_reads_is_declared(child_processes):
    declared = {o.variable for p in PROCESSES for o in p.options} | set(ELSEWHERE)
    sources = [*ROOT.glob("pybk/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("bookie_image/*"),
               *ROOT.glob("spark_image/*"),
               ROOT / "Dockerfile", *ROOT.glob("e2e/**/*.py")]
    used = {m for path in sources if path.is_file() and path not in (Path(__file__), Path(config.__file__))
            for m in re.findall(r"(?<![A-Z0-9_])PYBK_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text())}
    assert used - declared == set()


def test_embedded_autorecovery_takes_the_autorecovery_settings():
    env = {"PYBK_JOURNAL_DIR": "/j", "PYBK_LEDGER_DIR": "/l", "PYBK_RECOVERY_PARALLEL_LEDGERS": "7",
           "PYBK_RECOVERY_PARALLEL_RUNS": "2", "PYBK_LEDGER_PASSWORDS": "a,b"}
    options = config.settings(BookieSettings, parse(BOOKIE, ["--lost-bookie-delay", "5"]), BOOKIE, env).recovery
    assert (options.parallel_ledgers, options.parallel_runs, options.lost_bookie_delay) == (7, 2, 5.0)
    assert options.passwords == (b"", b"a", b"b")


def test_file_key_of_no_option_is_rejected_naming_it(tmp_path):
    file = tmp_path / "settings.yaml"
    file.write_text("refresh_interval: 5\n")
    with pytest.raises(ConfigError, match="'refresh_interval'"):
        resolve(parse(AUTORECOVERY, ["--config", str(file)]), AUTORECOVERY, {"PYBK_METADATA_URI": "etcd://h:1/p"})


@pytest.mark.parametrize("process", PROCESSES, ids=COMMANDS)
def test_each_process_declares_each_name_flag_and_variable_once(process):
    for key in (lambda o: o.name, lambda o: o.flag, lambda o: o.variable):
        keys = [key(o) for o in process.options]
        assert len(keys) == len(set(keys))


def test_an_option_in_common_reaches_every_process():
    assert all(p.options[:len(COMMON)] == COMMON for p in PROCESSES)


def test_cross_option_checks_reject_inconsistent_settings():
    with pytest.raises(ConfigError, match="low_water_mark <= high_water_mark"):
        resolve(parse(BOOKIE, ["--low-water-mark", "0.9", "--high-water-mark", "0.5"]), BOOKIE,
                {"PYBK_JOURNAL_DIR": "/j", "PYBK_LEDGER_DIR": "/l"})


def test_value_types_accept_their_spellings_and_refuse_the_rest():
    assert parse_bool("Yes") is True and parse_bool("off") is False
    assert parse_log_level("debug") == "DEBUG"
    assert Number(int, 1)("3") == 3 and Number(float, 0)("0.5") == 0.5
    for parse_value, bad in ((parse_bool, "maybe"), (parse_log_level, "loud"), (Number(int, 1), "0"),
                             (Number(int), "1.5"), (Number(float), True)):
        with pytest.raises(ValueError):
            parse_value(bad)


def test_a_setting_read_at_import_time_comes_from_the_same_declaration():
    refresh = OPERATOR.option("refresh_interval")
    assert refresh.value_in({}) == 20.0
    assert refresh.value_in({"PYBK_OPERATOR_REFRESH_INTERVAL": "5"}) == 5.0
    with pytest.raises(ConfigError, match="^PYBK_OPERATOR_REFRESH_INTERVAL: "):
        refresh.value_in({"PYBK_OPERATOR_REFRESH_INTERVAL": "-1"})


def test_the_environment_the_operator_gives_each_pod_is_accepted():
    from pybk.cluster.spec import load_manifest
    from pybk.operator import render

    spec = load_manifest(ROOT / "examples/bookiecluster-full.yaml")
    processes = {"bookie": BOOKIE, "autorecovery": AUTORECOVERY}
    workloads = [o for o in render.render(spec, "etcd://etcd:2379/pybk") if o["kind"] in ("StatefulSet", "Deployment")]
    containers = [c for obj in workloads for c in obj["spec"]["template"]["spec"]["containers"]]
    assert sorted(c["name"] for c in containers) == sorted(processes)
    for container in containers:
        env = {e["name"]: e.get("value", "10.0.0.1") for e in container["env"]}
        resolve(parse(processes[container["name"]], []), processes[container["name"]],
                {**env, "PYBK_CRD": "/opt/pybk/crds/bookiecluster.yaml"})
