"""The two test tiers, assigned from the fixtures a test uses, and the guard that keeps them honest.

A test is in the full tier (marker `processes`) when the `child_processes` fixture is in its fixture
closure: every fixture that starts etcd, a bookie, Spark, an operator or a container requests it,
so a new test lands in the right tier by itself. `make test-fast` runs the rest
(`-m "not processes"`): the tests that run in-process.

The guard: a test outside the full tier that starts one of those programs fails, naming the
program and what to do, so a fixture that forgets to declare itself is found at once, in either
tier, instead of slowing the fast one down."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

MARKER = "processes"
DECLARATION = "child_processes"

# What counts as a service process: pybk's own processes, etcd, Spark's JVM, containers, NATS.
# Short tool runs (mount, helm template) stay allowed in the fast tier.
_SERVICE_WORDS = ("pybk", "etcd", "java", "spark-submit", "podman", "nats-server")


def in_full_tier(item: pytest.Item) -> bool:
    return DECLARATION in getattr(item, "fixturenames", ())


_WIDTH = ("session", "package", "module", "class")
_SESSION_WIDE = frozenset({DECLARATION, "shared_etcd"})  # one per worker anyway: no reason to group by them


def shared_fixture(item: pytest.Item) -> str | None:
    """The widest-scoped fixture the test uses beyond its own (the Spark session before a
    module's cluster), as `where:name`; None when it uses none."""
    definitions = item._fixtureinfo.name2fixturedefs
    shared = [(_WIDTH.index(defs[-1].scope), f"{defs[-1].baseid}:{name}")
              for name in item.fixturenames if name not in _SESSION_WIDE
              for defs in [definitions.get(name)]
              if defs and defs[-1].scope in _WIDTH and defs[-1].baseid]   # a plugin's (baseid ""): not ours
    return min(shared)[1] if shared else None


def assign(items: list[pytest.Item]) -> None:
    """Mark every test whose fixtures start processes; the rest form the fast tier. Tests that
    share a wider-scoped fixture go to one worker (`xdist_group`, for `--dist loadgroup`), so a
    module's cluster or the Spark session starts once, not once per worker."""
    for item in items:
        if in_full_tier(item):
            item.add_marker(pytest.mark.processes)
            group = shared_fixture(item)
            if group:
                item.add_marker(pytest.mark.xdist_group(group))
                _name_group(item, group)


def says_slow(item: pytest.Item) -> bool:
    """The test's docstring has a `Slow:` line: why it needs more than 30 s."""
    return "Slow:" in (getattr(item, "obj", None).__doc__ or "")


def slow_first(items: list[pytest.Item]) -> None:
    """Move the slow tests, with every test of their xdist group, ahead of the rest, each part in
    its shuffled order. xdist hands out work in collection order, so a test of a minute handed
    out last keeps one worker busy while the others have finished."""
    def unit(item: pytest.Item) -> str:
        group = item.get_closest_marker("xdist_group")
        return group.args[0] if group else item.nodeid
    slow = {unit(item) for item in items if says_slow(item)}
    items.sort(key=lambda item: unit(item) not in slow)   # stable: the shuffled order within each part


def _name_group(item: pytest.Item, group: str) -> None:
    """On an xdist worker with `--dist loadgroup`, put the group in the node id ("<id>@<group>"),
    which is where the controller reads it. xdist 3.8 does this itself by setting `item._nodeid`,
    which pytest 9 no longer reads (a node id is its `_id`), so without this every group was
    silently ignored."""
    if not getattr(item.config.option, "loadgroup", False) or not hasattr(item, "_id") or "@" in item.nodeid:
        return
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{group}")


def service_program(argv) -> str | None:
    """The service program `argv` runs (e.g. "etcd", "python -m pybk.cli"), or None for a short
    tool run."""
    words = [str(a) for a in (argv if isinstance(argv, (list, tuple)) else [argv])]
    if not words:
        return None
    program = Path(words[0]).name
    if any(w in program for w in _SERVICE_WORDS):
        return program
    if program.startswith("python") and len(words) > 2 and words[1] == "-m" and words[2].startswith("pybk"):
        return f"{program} -m {words[2]}"
    return None


class TierGuard:
    """Refuses to start a service process for a test of the fast tier (see the module docstring)."""

    def __init__(self) -> None:
        self.current: pytest.Item | None = None
        self.violations: dict[str, str] = {}
        self._original = subprocess.Popen._execute_child

    def install(self) -> None:
        guard = self

        def execute_child(popen, args, *rest, **kwargs):
            guard.check(args)
            return guard._original(popen, args, *rest, **kwargs)

        subprocess.Popen._execute_child = execute_child

    def check(self, argv) -> None:
        item = self.current
        if item is None or in_full_tier(item):
            return
        program = service_program(argv)
        if program is None:
            return
        message = (f"{item.nodeid} starts {program} but is in the fast tier: none of its fixtures "
                   f"requests `{DECLARATION}` (tests/tiers.py); request it from the test or from the "
                   f"fixture that starts the process")
        self.violations[item.nodeid] = message
        raise RuntimeError(message)
