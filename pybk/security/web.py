"""Admin HTTP security, both ends: the aiohttp middleware that authorizes every request of a
bookie's or autorecovery's admin server, and what a client of those servers sends (https with
the CA, the bearer token).

Rules (docs/security.md): GET and HEAD of an `open_http_paths` path need nothing; any other GET
needs `reader` (Operation.INFO); every other method changes state and needs `admin`
(Operation.ADMINISTER). No or an unknown credential answers 401, a role too low 403, each with a
JSON body whose `error` names the cause.
"""
from __future__ import annotations

import json
import ssl
import urllib.request
from typing import Any, Iterable

from aiohttp import web

from .auth import AccessDenied, Authenticator, Denial
from .roles import Operation
from .settings import ClientSecurity

__all__ = ["READ_METHODS", "admin_headers", "admin_middleware", "admin_ssl", "admin_urlopen", "operation_of"]

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def operation_of(method: str, path: str, open_paths: frozenset[str]) -> Operation | None:
    """What a request asks for: None for an open path read, INFO for other reads, ADMINISTER for
    anything that changes state."""
    if method.upper() in READ_METHODS:
        return None if path in open_paths else Operation.INFO
    return Operation.ADMINISTER


def admin_middleware(authenticator: Authenticator | None, open_paths: Iterable[str]):
    """An aiohttp middleware enforcing the rules above; with no authenticator (or auth off) it
    lets everything through."""
    opened = frozenset(open_paths)

    @web.middleware
    async def authorize(request: web.Request, handler):
        if authenticator is None or not authenticator.enabled:
            return await handler(request)
        operation = operation_of(request.method, request.path, opened)
        if operation is not None:
            try:
                authenticator.authorize_http(request, operation)
            except AccessDenied as exc:
                status = 401 if exc.denial is Denial.UNAUTHENTICATED else 403
                headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
                return web.json_response({"error": f"{request.method} {request.path} refused: {exc.message}"},
                                         status=status, headers=headers)
        return await handler(request)

    return authorize


def admin_ssl(security: ClientSecurity) -> ssl.SSLContext | bool:
    """What aiohttp's `ssl=` takes for calling admin HTTP with these credentials: the SSLContext
    verifying with tls_ca, or True (default verification, for https URLs only)."""
    if not security.tls:
        return True
    from .tls import client_ssl_context
    return client_ssl_context(security)


def admin_headers(security: ClientSecurity) -> dict[str, str]:
    """The Authorization header carrying the bearer token, if there is one."""
    token = security.token()
    return {"Authorization": f"Bearer {token}"} if token else {}


def admin_urlopen(url: str, security: ClientSecurity, method: str = "GET", body: Any = None,
                  timeout: float = 10.0):
    """urllib's urlopen of an admin HTTP call (JSON body) with security's CA and token, for
    synchronous callers (test harnesses, the local runner); raises HTTPError as urlopen does."""
    headers = {"Content-Type": "application/json", **admin_headers(security)}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    context = None
    if security.tls and url.startswith("https:"):
        from .tls import client_ssl_context
        context = client_ssl_context(security)
    return urllib.request.urlopen(request, timeout=timeout, context=context)
