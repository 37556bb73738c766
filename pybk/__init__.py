"""pybk: replicated, append-only ledger storage in the model of Apache BookKeeper."""

__version__ = "0.1.0"
