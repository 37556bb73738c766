"""The add path's decisions (pybk.bookie.adds.decide), a pure function: runs and ledger states in,
refusals, writes and LACs out, nothing changed."""
from __future__ import annotations

from pybk import entry
from pybk.bookie.adds import AddRun, decide
from pybk.bookie.state import KEY_MISSING, LOOKUP, LedgerState
from pybk.proto import pb

KEY = entry.master_key(b"pw")
MAX = 1 << 20


def run(ledger: int, ids, key: bytes = KEY, flags: int = 0, lac=lambda e: e - 1, fill: bytes = b"x") -> AddRun:
    return AddRun(ledger, key, flags, list(ids), [entry.encode(ledger, e, lac(e), fill * 10) for e in ids])


def decided(runs, ledgers=None, held=None, keyless=False, admit=None):
    held = held or {}
    return decide(runs, ledgers if ledgers is not None else {}, max_entry_size=MAX,
                  held_last=lambda ledger: max(held.get(ledger, {}), default=-1),
                  existing=lambda ledger, e: held.get(ledger, {}).get(e), keyless=keyless, admit=admit)


def test_a_new_ledger_records_its_first_key_and_takes_the_highest_lac_and_changes_nothing():
    ledgers: dict = {}
    d = decided([run(1, range(3))], ledgers)
    assert d.errors == [] and d.lacs == {1: 1} and ledgers == {}
    (w,) = d.writes
    assert (w.ledger_id, w.new_key, list(w.entry_ids)) == (1, KEY, [0, 1, 2])


def test_a_wrong_key_is_refused_for_the_whole_run_and_nothing_is_written():
    d = decided([run(1, range(2), key=entry.master_key(b"other"))], {1: LedgerState(master_key=KEY)})
    assert [s for _, s, _ in d.errors] == [pb.UNAUTHORIZED] * 2 and d.writes == [] and d.lacs == {}


def test_malformed_entries_are_refused_one_by_one_and_the_rest_written():
    good = run(1, [0, 2])
    bad_lac = run(1, [1], lac=lambda e: e)
    mixed = AddRun(1, KEY, 0, [0, 1, 2], [good.bodies[0], bad_lac.bodies[0], good.bodies[1]])
    d = decided([mixed])
    assert [(i, s) for i, s, _ in d.errors] == [(1, pb.BAD_REQUEST)]
    assert list(d.writes[0].entry_ids) == [0, 2] and d.writes[0].packed is None


def test_a_fenced_ledger_takes_only_recovery_adds():
    fenced = {1: LedgerState(master_key=KEY, fenced=True)}
    assert [s for _, s, _ in decided([run(1, [5])], fenced).errors] == [pb.FENCED]
    assert decided([run(1, [5], flags=pb.RECOVERY_ADD)], fenced).errors == []


def test_keyless_adds_need_the_keyless_right_and_then_create_the_ledger_without_a_key():
    assert decided([run(1, [0], key=b"", flags=pb.RECOVERY_ADD)]).errors == [(0, pb.BAD_REQUEST, KEY_MISSING)]
    d = decided([run(1, [0], key=b"", flags=pb.RECOVERY_ADD)], keyless=True)
    assert d.errors == [] and d.writes[0].new_key == b""


def test_entries_are_write_once_against_the_bookie_and_earlier_runs_of_the_batch():
    held = {1: {0: run(1, [0]).bodies[0]}}
    state = {1: LedgerState(master_key=KEY)}
    assert decided([run(1, [0])], state, held).errors == []  # the same bytes again: a retry
    assert [s for _, s, _ in decided([run(1, [0], fill=b"y")], state, held).errors] == [pb.ENTRY_EXISTS]
    first, second = run(1, [0, 1]), run(1, [1], fill=b"y", flags=pb.RECOVERY_ADD)
    assert [(i, s) for i, s, _ in decided([first, second], state).errors] == [(2, pb.ENTRY_EXISTS)]


def test_an_admission_answering_lookup_leaves_the_run_to_the_service():
    d = decided([run(7, [0, 1])], admit=lambda ledger, key: (LOOKUP, ""))
    assert [s for _, s, _ in d.errors] == [LOOKUP, LOOKUP] and d.writes == []
