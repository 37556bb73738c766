"""The disk state (pybk.bookie.disk.DiskState): water marks, read-only reasons and their changes."""
from __future__ import annotations

from pybk.bookie.disk import READ_ONLY_FILE, DiskOptions, DiskState, ReadOnlyReason
from pybk.bookie.metrics import Metrics


def state(tmp_path, **options) -> tuple[DiskState, list[bool]]:
    changes: list[bool] = []
    disk = DiskState([tmp_path], DiskOptions(**options), Metrics())
    disk.on_change = changes.append
    return disk, changes


def test_the_water_marks_turn_the_bookie_read_only_and_writable_again(tmp_path):
    disk, changes = state(tmp_path, high_water_mark=0.8, low_water_mark=0.6)
    disk.measured(0.7, 1000)
    assert not disk.read_only
    disk.measured(0.8, 1000)
    assert disk.reasons == [ReadOnlyReason.DISK]
    disk.measured(0.7, 1000)  # between the marks: stays read-only
    assert disk.read_only
    disk.measured(0.5, 1000)
    assert not disk.read_only and changes == [True, False]


def test_its_own_writes_cross_the_high_water_mark_before_the_next_check(tmp_path):
    disk, changes = state(tmp_path, high_water_mark=0.8, low_water_mark=0.6)
    disk.measured(0.75, 1000)
    disk.note_written(60)
    assert disk.read_only and changes == [True]


def test_every_reason_is_kept_and_a_request_survives_a_restart(tmp_path):
    disk, changes = state(tmp_path)
    disk.request(True)
    disk.journal_failure(OSError("EIO"), recoverable=False)
    disk.no_room("checkpoint", OSError("ENOSPC"))
    assert set(disk.reasons) == set(ReadOnlyReason) and changes == [True]
    assert (tmp_path / READ_ONLY_FILE).exists()
    again, _ = state(tmp_path)
    again.open()
    assert again.forced
    again.request(False)
    assert not (tmp_path / READ_ONLY_FILE).exists()
