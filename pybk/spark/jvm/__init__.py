"""pybk's JVM side of Spark: the columnar reader of named logs, as a jar built from `src/`.

Spark's Python data sources hand every row through a Python worker and an Arrow stream; a log
scan then costs a JVM, a Python and a bookie share per record. The jar reads a log's entries
straight from the bookies into Spark's column vectors (gRPC over Netty's HTTP/2 codec, which
Spark ships), so a scan pays the JVM and the bookies only. Planning stays in Python (what the
scan reads: `pybk.spark.logplan`); the JVM asks the driver's Python for it.

The jar is built here from the Java sources with the JDK's compiler against the jars of the
installed Spark, into a cache named by the hash of the sources and of Spark's version, so a
change to either builds a new one and a stale jar is never used. `python -m pybk.spark.jvm`
builds it and prints its path. No JDK (only a JRE): no jar, and scans take the Python path.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger("pybk.spark")

SOURCES = Path(__file__).parent / "src"
JAVA_RELEASE = "17"


class JarBuildError(RuntimeError):
    """The Java sources did not compile: the compiler's output says why."""


def spark_jars() -> Path:
    """The jars of the Spark that pyspark runs ($SPARK_HOME/jars, else the pyspark package's)."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home) / "jars"
    import pyspark
    return Path(pyspark.__file__).parent / "jars"


def _sources() -> list[Path]:
    return sorted(p for p in SOURCES.rglob("*") if p.is_file())


def _digest() -> str:
    """Hash of the sources and of the Spark they compile against."""
    h = hashlib.sha256()
    for p in _sources():
        h.update(str(p.relative_to(SOURCES)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(",".join(sorted(p.name for p in spark_jars().glob("spark-*.jar"))).encode())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    """Where built jars are kept: $PYBK_CACHE_DIR, else $XDG_CACHE_HOME/pybk or ~/.cache/pybk."""
    base = os.environ.get("PYBK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pybk")
    return Path(base) / "spark-jvm"


def java() -> str | None:
    """The Java runtime Spark runs on: $JAVA_HOME/bin/java when JAVA_HOME is set (whether or not it
    is there: the caller says so), else `java` on PATH; None without either."""
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else shutil.which("java")


def javac() -> str | None:
    """The JDK's compiler: $JAVA_HOME/bin/javac, else `javac` on PATH; None without a JDK."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "javac"), os.X_OK):
        return os.path.join(home, "bin", "javac")
    return shutil.which("javac")


def jar_path() -> Path:
    """The path of the jar of the current sources (built or not)."""
    return cache_dir() / f"pybk-spark-{_digest()}.jar"


def build() -> Path:
    """The jar of the current sources, compiled now unless it is there already. JarBuildError
    when there is no JDK or the sources do not compile."""
    target = jar_path()
    if target.exists():
        return target
    compiler = javac()
    if compiler is None:
        raise JarBuildError("no Java compiler (javac): install a JDK (apt-get install -y openjdk-17-jdk-headless) "
                            "to build pybk's Spark jar; scans of logs take the Python path without it")
    java = [p for p in _sources() if p.suffix == ".java"]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pybk-jar-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        cmd = [compiler, "--release", JAVA_RELEASE, "-nowarn", "-encoding", "UTF-8", "-proc:none",
               "-cp", str(spark_jars() / "*"), "-d", str(classes)] + [str(p) for p in java]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise JarBuildError(f"javac failed (exit {out.returncode}):\n{out.stderr}{out.stdout}")
        part = Path(tmp) / target.name
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: pybk\n")
            for p in sorted(classes.rglob("*.class")):
                jar.write(p, str(p.relative_to(classes)))
            for p in _sources():
                if p.suffix != ".java":
                    jar.write(p, str(p.relative_to(SOURCES / "resources")) if "resources" in p.parts
                              else str(p.relative_to(SOURCES)))
        os.replace(part, target)   # atomic: a concurrent build writes the same bytes
    log.info("built %s", target)
    return target


# a short-lived JVM (a tool run): compile less and collect simply, half the start-up CPU
SHORT_RUN = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def java_command(jar: Path, main_class: str, jvm_options: tuple[str, ...] = SHORT_RUN) -> list[str]:
    """The command that runs one of the jar's tools (ReadTool, DecodeTool) with Spark's jars."""
    return [java() or "java", *jvm_options, "-cp", f"{jar}:{spark_jars()}/*", f"pybk.spark.jvm.{main_class}"]


def classpath_conf(jar: str | Path) -> dict[str, str]:
    """Spark settings that put this jar on the driver's and the executors' classpath."""
    return {"spark.driver.extraClassPath": str(jar), "spark.executor.extraClassPath": str(jar)}


def available_jar() -> Path | None:
    """The jar: $PYBK_SPARK_JAR when set (a prebuilt one, as the Spark image has), else built if
    need be; None (with the reason logged) when it cannot be."""
    prebuilt = os.environ.get("PYBK_SPARK_JAR")
    if prebuilt:
        if os.path.isfile(prebuilt):
            return Path(prebuilt)
        log.warning("pybk: PYBK_SPARK_JAR=%s is not a file: no JVM log reader", prebuilt)
        return None
    try:
        return build()
    except (JarBuildError, OSError) as exc:
        log.warning("pybk: no JVM log reader: %s", str(exc).splitlines()[0])
        return None
