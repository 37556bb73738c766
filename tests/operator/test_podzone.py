"""`python -m pybk.operator.podzone` outside a pod: it names exactly the variables that are missing."""
from __future__ import annotations

import json
import os
import subprocess
import sys


def test_outside_a_pod_names_only_the_missing_variable(child_processes) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env.update(POD_NAME="demo-0", POD_NAMESPACE="default")
    out = subprocess.run([sys.executable, "-m", "pybk.operator.podzone", "--wait", "0"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout == "\n"
    assert "(KUBERNETES_SERVICE_HOST unset)" in out.stderr, out.stderr
    assert "POD_NAME" not in out.stderr, out.stderr


def test_it_logs_json_lines_when_the_pod_logs_json(child_processes) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env.update(POD_NAME="demo-0", POD_NAMESPACE="default", PYBK_LOG_FORMAT="json")
    out = subprocess.run([sys.executable, "-m", "pybk.operator.podzone", "--wait", "0"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "\n"
    (line,) = out.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "WARNING" and record["logger"] == "pybk.operator.podzone"
    assert record["message"] == "not in a Kubernetes pod (KUBERNETES_SERVICE_HOST unset); no zone"
