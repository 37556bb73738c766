"""An interrupt that arrives while a child is being spawned never orphans that child."""
import sys

import pytest

from pybk.local import process
from pybk.local.process import ChildProcess


def test_interrupt_during_spawn_is_raised_once_the_child_is_kept(tmp_path):
    child = ChildProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "c.log")
    process._spawning += 1          # as if Popen were running when the signal came
    try:
        process.interrupt_or_defer()
    finally:
        process._spawning -= 1
    try:
        with pytest.raises(KeyboardInterrupt):
            child.start()
        assert child.alive(), "the child was started and its pid kept, so it can be stopped"
    finally:
        child.stop()
    assert not child.alive() and process._deferred is False


def test_interrupt_outside_a_spawn_is_raised_at_once():
    with pytest.raises(KeyboardInterrupt):
        process.interrupt_or_defer()
