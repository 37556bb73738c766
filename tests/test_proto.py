"""The committed generated protobuf code matches bookie.proto; hand-decoded answers match protobuf's."""
import pytest
from google.protobuf.message import DecodeError

from pybk.proto import generate, pb, wire


def test_generated_code_is_current():
    assert generate.stale_files() == [], "run `make proto` and commit the result"


def test_status_names_follow_bookkeeper():
    assert [pb.Status.Name(v) for v in sorted(pb.Status.values())] == [
        "OK", "NO_LEDGER", "NO_ENTRY", "BAD_REQUEST", "IO_ERROR", "UNAUTHORIZED",
        "FENCED", "READ_ONLY", "TOO_MANY_REQUESTS", "ACCESS_DENIED", "ENTRY_EXISTS"]


def test_a_packed_read_answer_decodes_with_its_bodies_left_where_they_came():
    bodies = [b"a" * 300, b"", b"bc" * 70]
    data = wire.encode_packed(pb.ReadResults(status=pb.OK, lac=41, first_body_entry=40, message="m"), bodies)
    res, view = wire.read_results(data)
    assert isinstance(view, memoryview) and view.readonly and view.obj is data
    assert bytes(view) == b"".join(bodies) and list(res.body_sizes) == [300, 0, 140]
    assert (res.lac, res.first_body_entry, res.message, res.bodies) == (41, 40, "m", b"")
    assert pb.ReadResults.FromString(data).bodies == b"".join(bodies)
    with pytest.raises(DecodeError):
        wire.read_results(data[:-1])
