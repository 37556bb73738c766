"""The committed generated protobuf code matches bookie.proto."""
from pybk.proto import generate, pb


def test_generated_code_is_current():
    assert generate.stale_files() == [], "run `make proto` and commit the result"


def test_status_names_follow_bookkeeper():
    assert [pb.Status.Name(v) for v in sorted(pb.Status.values())] == [
        "OK", "NO_LEDGER", "NO_ENTRY", "BAD_REQUEST", "IO_ERROR", "UNAUTHORIZED",
        "FENCED", "READ_ONLY", "TOO_MANY_REQUESTS", "ACCESS_DENIED", "ENTRY_EXISTS"]
