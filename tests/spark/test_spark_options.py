"""Bad options fail when the query is defined or planned, with a message naming the option."""
from __future__ import annotations

import pytest

from pybk.spark.session import JAVA_PACKAGE, java_problem


def test_missing_java_names_the_package_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    problem = java_problem()
    assert problem is not None and JAVA_PACKAGE in problem and "apt-get install" in problem
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert JAVA_PACKAGE in (java_problem() or "")


@pytest.mark.parametrize("options, words", [
    ({"ledgers": "1,x"}, "'x' is not a ledger id"),
    ({"ledgers": "9-3"}, "ends before it starts"),
    ({"ledgers": "1", "entriesPerPartition": "0"}, "entriesPerPartition"),
    ({"ledgers": "1", "startEntry": "4", "endEntry": "2"}, "before startEntry"),
])
def test_bad_read_options_fail_at_load_with_clear_errors(spark, options, words):
    reader = spark.read.format("pybk").option("metadataServiceUri", "etcd://127.0.0.1:1/pybk")
    for k, v in options.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception, match=words):
        reader.load()


def test_old_java_is_recognised_by_its_version_string():
    from pybk.spark.session import _major_version
    assert _major_version('openjdk version "17.0.15" 2025-04-15') == 17
    assert _major_version('java version "1.8.0_292"') == 8
    assert _major_version('openjdk version "21" 2023-09-19') == 21
    assert _major_version("no version here") is None
