"""One local[2] Spark session for the whole test session (start-up costs 5-8 s)."""
from __future__ import annotations

import pytest

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
