"""The driver's Python as the JVM reader's planner (py4j calls from the JVM into this process).

`attach(spark)` registers a Planner with the JVM side of the pybk source when pybk's jar is on
the session's classpath; the JVM then asks it, per batch scan, whether it reads the scan and
what to read. Plans are made on one thread of this process with its own event loop (the
source's `runtime`), whatever thread of py4j's the JVM calls on: the shared client stays on one
loop, and a driver program that runs an event loop of its own (a notebook) is not disturbed.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging

from ..errors import is_user_error
from ..runtime import run

log = logging.getLogger("pybk.spark")

_PLANS = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pybk-jvm-plan")


class Planner:
    """pybk.spark.jvm.Planner (Planner.java), implemented in Python for py4j."""

    def handles(self, options_json: str) -> bool:
        from .plan import handles
        return handles(json.loads(options_json))

    def plan(self, options_json: str, schema_json: str) -> str:
        from .plan import plan
        try:
            answer = _PLANS.submit(run, plan(json.loads(options_json), schema_json)).result()
        except Exception as exc:   # the JVM raises it, its first line the cause
            if not is_user_error(exc):
                log.exception("pybk: planning a JVM log scan failed")
            answer = {"error": str(exc) if is_user_error(exc) else f"planning failed: {type(exc).__name__}: {exc}"}
        return json.dumps(answer)

    class Java:
        implements = ["pybk.spark.jvm.Planner"]


def attach(spark) -> bool:
    """Register the planner with the JVM side of the pybk source when the session has pybk's jar;
    False when it does not (format("pybk") is then the Python source alone)."""
    from py4j.java_gateway import JavaClass
    from pyspark.java_gateway import ensure_callback_server_started
    try:
        planners = spark._jvm.pybk.spark.jvm.Planners
    except Exception:   # a session without a JVM gateway (Spark Connect)
        return False
    if not isinstance(planners, JavaClass):
        return False
    ensure_callback_server_started(spark.sparkContext._gateway)
    planners.register(Planner())
    return True
