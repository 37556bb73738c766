"""A local Spark session that works on this machine, or a plain error saying what is missing.

Two things break PySpark obscurely: no `java` (the JVM gateway dies with a cryptic message) and
workers started with a different Python than the driver's (they cannot import pybk or pyarrow).
`require_java()` names the package to install; `local_session()` pins PYSPARK_PYTHON to this
interpreter, puts pybk's jar on the classpath (`jar_conf`), registers the `pybk` data source and
turns on Python filter pushdown.
"""
from __future__ import annotations

import os
import subprocess
import sys

JAVA_PACKAGE = "openjdk-17-jre-headless"


class JavaMissingError(RuntimeError):
    """No usable Java runtime: Spark cannot start."""


def java_problem() -> str | None:
    """None when a Java runtime (17+) is usable, else a message that says what to install."""
    from .jvm import java as java_runtime
    java_home = os.environ.get("JAVA_HOME")
    java = java_runtime()
    if not java or not os.path.exists(java):
        where = f"JAVA_HOME={java_home} has no bin/java" if java_home else "no `java` on PATH"
        return (f"Spark needs a Java runtime (17 or newer) and this machine has none ({where}). "
                f"Install it with: apt-get install -y {JAVA_PACKAGE}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{java} -version` failed ({exc}); reinstall Java: apt-get install -y {JAVA_PACKAGE}"
    text = out.stderr + out.stdout
    version = _major_version(text)
    if version is not None and version < 17:
        return (f"Spark 4 needs Java 17 or newer but `{java}` is Java {version}. "
                f"Install it with: apt-get install -y {JAVA_PACKAGE}")
    return None


def _major_version(text: str) -> int | None:
    import re
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def require_java() -> None:
    """Raise JavaMissingError with the package to install when Spark cannot start."""
    problem = java_problem()
    if problem:
        raise JavaMissingError(problem)


def local_session(master: str = "local[2]", app_name: str = "pybk", conf: dict[str, str] | None = None):
    """Start (or get) a local SparkSession ready for the `pybk` data source."""
    require_java()
    import warnings
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.sql.python.filterPushdown.enabled", "true"))
    for key, value in {**jar_conf(), **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    from . import register
    register(spark)
    return spark


def jar_conf() -> dict[str, str]:
    """Spark settings that put pybk's jar (its JVM log reader, `pybk.spark.jvm`) on the driver's
    and the executors' classpath; none when it cannot be built (no JDK): then format("pybk") is
    the Python source alone."""
    from .jvm import available_jar, classpath_conf
    jar = available_jar()
    return {} if jar is None else classpath_conf(jar)


def activate(spark) -> None:
    """Make spark the JVM's active session for the calling Python thread.

    Spark resolves a format name for writes through the thread's active session; a Python thread
    other than the one that registered `pybk` has none, and `df.write.format("pybk")` then fails
    with DATA_SOURCE_NOT_FOUND. Call this first in such a thread.
    """
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
