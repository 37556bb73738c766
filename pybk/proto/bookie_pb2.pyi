from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Status]
    NO_LEDGER: _ClassVar[Status]
    NO_ENTRY: _ClassVar[Status]
    BAD_REQUEST: _ClassVar[Status]
    IO_ERROR: _ClassVar[Status]
    UNAUTHORIZED: _ClassVar[Status]
    FENCED: _ClassVar[Status]
    READ_ONLY: _ClassVar[Status]
    TOO_MANY_REQUESTS: _ClassVar[Status]
    ACCESS_DENIED: _ClassVar[Status]
    ENTRY_EXISTS: _ClassVar[Status]

class AddFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADD_NONE: _ClassVar[AddFlag]
    RECOVERY_ADD: _ClassVar[AddFlag]

class ReadFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_NONE: _ClassVar[ReadFlag]
    FENCE: _ClassVar[ReadFlag]
    LONG_POLL: _ClassVar[ReadFlag]
    PACKED: _ClassVar[ReadFlag]
    DIGESTS_CHECKED: _ClassVar[ReadFlag]
    FOLLOW: _ClassVar[ReadFlag]
OK: Status
NO_LEDGER: Status
NO_ENTRY: Status
BAD_REQUEST: Status
IO_ERROR: Status
UNAUTHORIZED: Status
FENCED: Status
READ_ONLY: Status
TOO_MANY_REQUESTS: Status
ACCESS_DENIED: Status
ENTRY_EXISTS: Status
ADD_NONE: AddFlag
RECOVERY_ADD: AddFlag
READ_NONE: ReadFlag
FENCE: ReadFlag
LONG_POLL: ReadFlag
PACKED: ReadFlag
DIGESTS_CHECKED: ReadFlag
FOLLOW: ReadFlag

class AddEntry(_message.Message):
    __slots__ = ("request_id", "ledger_id", "entry_id", "master_key", "flags", "body")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    ledger_id: int
    entry_id: int
    master_key: bytes
    flags: int
    body: bytes
    def __init__(self, request_id: _Optional[int] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., flags: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class AddRun(_message.Message):
    __slots__ = ("request_id", "ledger_id", "master_key", "flags", "entry_ids", "body_sizes", "bodies")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    BODY_SIZES_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    ledger_id: int
    master_key: bytes
    flags: int
    entry_ids: _containers.RepeatedScalarFieldContainer[int]
    body_sizes: _containers.RepeatedScalarFieldContainer[int]
    bodies: bytes
    def __init__(self, request_id: _Optional[int] = ..., ledger_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., flags: _Optional[int] = ..., entry_ids: _Optional[_Iterable[int]] = ..., body_sizes: _Optional[_Iterable[int]] = ..., bodies: _Optional[bytes] = ...) -> None: ...

class AddBatch(_message.Message):
    __slots__ = ("entries", "runs")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AddEntry]
    runs: _containers.RepeatedCompositeFieldContainer[AddRun]
    def __init__(self, entries: _Optional[_Iterable[_Union[AddEntry, _Mapping]]] = ..., runs: _Optional[_Iterable[_Union[AddRun, _Mapping]]] = ...) -> None: ...

class AddResult(_message.Message):
    __slots__ = ("request_id", "ledger_id", "entry_id", "status", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    ledger_id: int
    entry_id: int
    status: Status
    message: str
    def __init__(self, request_id: _Optional[int] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class AddFailure(_message.Message):
    __slots__ = ("index", "entry_id", "status", "message")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    entry_id: int
    status: Status
    message: str
    def __init__(self, index: _Optional[int] = ..., entry_id: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class AddRunResult(_message.Message):
    __slots__ = ("request_id", "status", "message", "failures")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    status: Status
    message: str
    failures: _containers.RepeatedCompositeFieldContainer[AddFailure]
    def __init__(self, request_id: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., failures: _Optional[_Iterable[_Union[AddFailure, _Mapping]]] = ...) -> None: ...

class AddResults(_message.Message):
    __slots__ = ("results", "runs")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AddResult]
    runs: _containers.RepeatedCompositeFieldContainer[AddRunResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AddResult, _Mapping]]] = ..., runs: _Optional[_Iterable[_Union[AddRunResult, _Mapping]]] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("ledger_id", "first_entry", "last_entry", "flags", "master_key", "previous_lac", "timeout_ms", "step")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry: int
    last_entry: int
    flags: int
    master_key: bytes
    previous_lac: int
    timeout_ms: int
    step: int
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry: _Optional[int] = ..., last_entry: _Optional[int] = ..., flags: _Optional[int] = ..., master_key: _Optional[bytes] = ..., previous_lac: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class ReadEntry(_message.Message):
    __slots__ = ("entry_id", "body")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    entry_id: int
    body: bytes
    def __init__(self, entry_id: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class ReadResults(_message.Message):
    __slots__ = ("status", "message", "entries", "lac", "missing_entry", "first_body_entry", "bodies", "body_sizes")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    MISSING_ENTRY_FIELD_NUMBER: _ClassVar[int]
    FIRST_BODY_ENTRY_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    BODY_SIZES_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    entries: _containers.RepeatedCompositeFieldContainer[ReadEntry]
    lac: int
    missing_entry: int
    first_body_entry: int
    bodies: bytes
    body_sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[ReadEntry, _Mapping]]] = ..., lac: _Optional[int] = ..., missing_entry: _Optional[int] = ..., first_body_entry: _Optional[int] = ..., bodies: _Optional[bytes] = ..., body_sizes: _Optional[_Iterable[int]] = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class ReadLacResponse(_message.Message):
    __slots__ = ("status", "message", "lac", "last_entry_body")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_BODY_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    lac: int
    last_entry_body: bytes
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., lac: _Optional[int] = ..., last_entry_body: _Optional[bytes] = ...) -> None: ...

class WriteLacRequest(_message.Message):
    __slots__ = ("ledger_id", "lac", "master_key")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    lac: int
    master_key: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., lac: _Optional[int] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class WriteLacResponse(_message.Message):
    __slots__ = ("status", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("bookie_id", "read_only", "free_bytes", "total_bytes", "version", "zone", "ledger_count", "caller", "caller_role")
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    LEDGER_COUNT_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    CALLER_ROLE_FIELD_NUMBER: _ClassVar[int]
    bookie_id: str
    read_only: bool
    free_bytes: int
    total_bytes: int
    version: str
    zone: str
    ledger_count: int
    caller: str
    caller_role: str
    def __init__(self, bookie_id: _Optional[str] = ..., read_only: _Optional[bool] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., version: _Optional[str] = ..., zone: _Optional[str] = ..., ledger_count: _Optional[int] = ..., caller: _Optional[str] = ..., caller_role: _Optional[str] = ...) -> None: ...

class ListEntriesRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class EntryRange(_message.Message):
    __slots__ = ("first", "last")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class ListEntriesResponse(_message.Message):
    __slots__ = ("status", "message", "ranges")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    ranges: _containers.RepeatedCompositeFieldContainer[EntryRange]
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., ranges: _Optional[_Iterable[_Union[EntryRange, _Mapping]]] = ...) -> None: ...

class ListLedgersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListLedgersResponse(_message.Message):
    __slots__ = ("ledger_ids",)
    LEDGER_IDS_FIELD_NUMBER: _ClassVar[int]
    ledger_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ledger_ids: _Optional[_Iterable[int]] = ...) -> None: ...
