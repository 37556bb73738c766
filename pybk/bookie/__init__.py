"""The bookie: the storage server (journal, entry log, LMDB index) behind a gRPC service."""
