"""One local[2] Spark session for the whole test session (start-up costs 5-8 s), pybk's Spark jar,
and a secured local cluster per module that asks for one."""
from __future__ import annotations

import shutil

import pytest

from pybk.local import control
from pybk.spark.jvm import build, javac
from pybk.spark.session import java_problem


@pytest.fixture(scope="session")
def spark(child_processes):
    """A shared SparkSession with the `pybk` format registered; skipped without Java."""
    problem = java_problem()
    if problem:
        pytest.skip(problem)
    from pybk.spark.session import local_session
    session = local_session("local[2]", "pybk-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def jar(child_processes):
    """pybk's Spark jar of the current sources (its JVM reader). Function-scoped: built once (a
    cached build is a hash of the sources), it must not tie its tests to one worker."""
    if javac() is None or shutil.which("java") is None:
        pytest.skip("no JDK (javac and java): the JVM reader cannot be built")
    return build()


@pytest.fixture(scope="module")
def secured(tmp_path_factory, child_processes):
    """A local cluster started `pybk local up --secure` (TLS, etcd auth, tokens): its data dir."""
    tmp = tmp_path_factory.mktemp("spark-secure")
    path = tmp / "cluster.yaml"
    path.write_text("apiVersion: pybk.io/v1alpha1\nkind: BookieCluster\nmetadata: {name: s}\n"
                    "spec:\n  replicas: 3\n  autorecovery: {replicas: 0}\n")
    with control.detached(path, tmp / "d", secure=True):
        yield tmp / "d"
