from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Fragment(_message.Message):
    __slots__ = ("first_entry_id", "bookies")
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BOOKIES_FIELD_NUMBER: _ClassVar[int]
    first_entry_id: int
    bookies: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, first_entry_id: _Optional[int] = ..., bookies: _Optional[_Iterable[str]] = ...) -> None: ...

class LedgerMetadataFormat(_message.Message):
    __slots__ = ("format_version", "ledger_id", "ensemble_size", "write_quorum", "ack_quorum", "state", "last_entry_id", "length", "digest_type", "password_hash", "ctime_ms", "custom", "fragments", "master_key", "key_check")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OPEN: _ClassVar[LedgerMetadataFormat.State]
        IN_RECOVERY: _ClassVar[LedgerMetadataFormat.State]
        CLOSED: _ClassVar[LedgerMetadataFormat.State]
    OPEN: LedgerMetadataFormat.State
    IN_RECOVERY: LedgerMetadataFormat.State
    CLOSED: LedgerMetadataFormat.State
    class Digest(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CRC32C: _ClassVar[LedgerMetadataFormat.Digest]
        MAC: _ClassVar[LedgerMetadataFormat.Digest]
    CRC32C: LedgerMetadataFormat.Digest
    MAC: LedgerMetadataFormat.Digest
    class CustomEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUORUM_FIELD_NUMBER: _ClassVar[int]
    ACK_QUORUM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DIGEST_TYPE_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_HASH_FIELD_NUMBER: _ClassVar[int]
    CTIME_MS_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    KEY_CHECK_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: LedgerMetadataFormat.State
    last_entry_id: int
    length: int
    digest_type: LedgerMetadataFormat.Digest
    password_hash: bytes
    ctime_ms: int
    custom: _containers.ScalarMap[str, bytes]
    fragments: _containers.RepeatedCompositeFieldContainer[Fragment]
    master_key: bytes
    key_check: bytes
    def __init__(self, format_version: _Optional[int] = ..., ledger_id: _Optional[int] = ..., ensemble_size: _Optional[int] = ..., write_quorum: _Optional[int] = ..., ack_quorum: _Optional[int] = ..., state: _Optional[_Union[LedgerMetadataFormat.State, str]] = ..., last_entry_id: _Optional[int] = ..., length: _Optional[int] = ..., digest_type: _Optional[_Union[LedgerMetadataFormat.Digest, str]] = ..., password_hash: _Optional[bytes] = ..., ctime_ms: _Optional[int] = ..., custom: _Optional[_Mapping[str, bytes]] = ..., fragments: _Optional[_Iterable[_Union[Fragment, _Mapping]]] = ..., master_key: _Optional[bytes] = ..., key_check: _Optional[bytes] = ...) -> None: ...
