"""Transports built on proven protocol engines (ngh2_server and ngh2_client: gRPC over
libnghttp2's HTTP/2), and the one rule that says which HTTP/2 engine a process uses."""
from __future__ import annotations

import importlib.util
import os

ENGINE_VARIABLE = "PYBK_HTTP2_ENGINE"               # both sides: the server's connections, the client's Add streams
CLIENT_ENGINE_VARIABLE = "PYBK_HTTP2_CLIENT_ENGINE"  # the client's Add streams alone (over ENGINE_VARIABLE)
ENGINES = ("own", "ngh2")  # pybk.proto's own framing (the default), libnghttp2 through ngh2


def http2_engine(engine: str | None = None, client: bool = False) -> str:
    """The HTTP/2 engine to use: `engine`, else (for a client stream) PYBK_HTTP2_CLIENT_ENGINE,
    else PYBK_HTTP2_ENGINE, else `own`. ValueError names an unknown one and where it came from,
    ModuleNotFoundError the ngh2 engine when its package is not installed."""
    where = "given"
    if not engine and client and os.environ.get(CLIENT_ENGINE_VARIABLE):
        engine, where = os.environ[CLIENT_ENGINE_VARIABLE], CLIENT_ENGINE_VARIABLE
    if not engine and os.environ.get(ENGINE_VARIABLE):
        engine, where = os.environ[ENGINE_VARIABLE], ENGINE_VARIABLE
    engine = engine or "own"
    if engine not in ENGINES:
        raise ValueError(f"HTTP/2 engine {engine!r} ({where}) is not one of {', '.join(ENGINES)}")
    if engine == "ngh2" and importlib.util.find_spec("ngh2") is None:
        raise ModuleNotFoundError(f"HTTP/2 engine 'ngh2' ({where}) needs the ngh2 package: pip install -e '.[ngh2]'",
                                  name="ngh2")
    return engine
