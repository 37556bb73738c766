"""Parse the metadata service URI `etcd://host:port[,host:port...]/prefix[?option=value&...]`.

Options: `timeout` (seconds, bound of every etcd call, default 5) and `lease_ttl` (seconds,
the session lease, default 10). Options ride in the URI so that any process handed a URI
(bookies, autorecovery, Spark executors) gets the same settings.
"""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

from .errors import BadMetadataUriError

__all__ = ["BadMetadataUriError", "MetadataUri", "parse"]

DEFAULT_PORT = 2379
DEFAULT_TIMEOUT = 5.0
DEFAULT_LEASE_TTL = 10
OPTIONS = {"timeout": float, "lease_ttl": int}
_PREFIX_RE = re.compile(r"^[A-Za-z0-9._\-]+(/[A-Za-z0-9._\-]+)*$")
_HOST_RE = re.compile(r"^[A-Za-z0-9._\-]+$")


@dataclass(frozen=True)
class MetadataUri:
    """A parsed metadata service URI."""

    endpoints: tuple[tuple[str, int], ...]
    prefix: str
    timeout: float = DEFAULT_TIMEOUT
    lease_ttl: int = DEFAULT_LEASE_TTL
    options: dict = field(default_factory=dict, compare=False)

    @property
    def endpoint_text(self) -> str:
        """The endpoints as `host:port,host:port`, for messages."""
        return ",".join(_join_host_port(h, p) for h, p in self.endpoints)

    @property
    def key_prefix(self) -> bytes:
        """The etcd key prefix every key of this cluster starts with (`/prefix/`)."""
        return f"/{self.prefix}/".encode()

    def __str__(self) -> str:
        query = urllib.parse.urlencode(self.options)
        return f"etcd://{self.endpoint_text}/{self.prefix}" + (f"?{query}" if query else "")


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_endpoint(text: str, uri: str) -> tuple[str, int]:
    if not text:
        raise BadMetadataUriError(f"metadata URI {uri!r}: empty endpoint in the host list")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise BadMetadataUriError(f"metadata URI {uri!r}: IPv6 endpoint {text!r} lacks its closing ']'")
        host, rest = text[1:end], text[end + 1:]
        if rest and not rest.startswith(":"):
            raise BadMetadataUriError(f"metadata URI {uri!r}: unexpected {rest!r} after IPv6 address {host!r}")
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = text.partition(":")
        if not _HOST_RE.match(host):
            raise BadMetadataUriError(f"metadata URI {uri!r}: {host!r} is not a valid host name or address")
    if not host:
        raise BadMetadataUriError(f"metadata URI {uri!r}: endpoint {text!r} has no host")
    if port_text == "":
        if text.endswith(":"):
            raise BadMetadataUriError(f"metadata URI {uri!r}: endpoint {text!r} has an empty port")
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise BadMetadataUriError(f"metadata URI {uri!r}: port {port_text!r} of endpoint {text!r} "
                                  "is not a number between 1 and 65535")
    return host, int(port_text)


def parse(uri: str) -> MetadataUri:
    """Parse a metadata service URI; raise BadMetadataUriError naming what is wrong."""
    if not isinstance(uri, str) or not uri:
        raise BadMetadataUriError("metadata URI is empty; expected etcd://host:port[,host:port...]/prefix")
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise BadMetadataUriError(f"metadata URI {uri!r} has no scheme; expected etcd://host:port/prefix")
    if scheme != "etcd":
        raise BadMetadataUriError(f"metadata URI {uri!r}: unsupported scheme {scheme!r}; only 'etcd' is supported")
    rest, _, query = rest.partition("?")
    hosts, slash, prefix = rest.partition("/")
    if not hosts:
        raise BadMetadataUriError(f"metadata URI {uri!r} names no etcd endpoint (host:port)")
    endpoints = tuple(_parse_endpoint(h.strip(), uri) for h in hosts.split(","))
    prefix = prefix.strip("/")
    if not slash or not prefix:
        raise BadMetadataUriError(f"metadata URI {uri!r} has no key prefix; add one, e.g. etcd://{hosts}/pybk")
    if not _PREFIX_RE.match(prefix):
        raise BadMetadataUriError(f"metadata URI {uri!r}: prefix {prefix!r} may hold only letters, digits, "
                                  "'.', '_', '-' and '/' between non-empty parts")
    options: dict = {}
    for name, values in urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=False).items():
        if name not in OPTIONS:
            raise BadMetadataUriError(f"metadata URI {uri!r}: unknown option {name!r}; known: {', '.join(OPTIONS)}")
        try:
            value = OPTIONS[name](values[-1])
        except ValueError:
            raise BadMetadataUriError(f"metadata URI {uri!r}: option {name}={values[-1]!r} is not a "
                                      f"{OPTIONS[name].__name__}") from None
        if value <= 0:
            raise BadMetadataUriError(f"metadata URI {uri!r}: option {name} must be positive, got {value}")
        options[name] = value
    return MetadataUri(endpoints, prefix, options.get("timeout", DEFAULT_TIMEOUT),
                       options.get("lease_ttl", DEFAULT_LEASE_TTL), options)
