"""Parse the metadata service URI `etcd://host:port[,host:port...]/prefix[?option=value&...]`.

Options: `timeout` (seconds, bound of every etcd call, default 5) and `lease_ttl` (seconds,
the session lease, default 10). Options ride in the URI so that any process handed a URI
(bookies, autorecovery, Spark executors) gets the same settings.

Security options name files, never secrets, so that a URI may be logged and passed in argv:
`tls_ca` (the CA that signed etcd's certificate; setting it turns TLS on), `tls_cert` and
`tls_key` (a client certificate, for etcd's `--client-cert-auth`), `tls_server_name` (the name
expected in etcd's certificate, default the first endpoint's host), `user` and `password_file`
(etcd user/password authentication; the file holds the password). A `password` option or
`user:password@` credentials are refused.
"""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

from .errors import BadMetadataUriError

__all__ = ["BadMetadataUriError", "MetadataUri", "parse", "read_option_file", "read_secret", "redact"]

DEFAULT_PORT = 2379
DEFAULT_TIMEOUT = 5.0
DEFAULT_LEASE_TTL = 10
NUMBER_OPTIONS = {"timeout": float, "lease_ttl": int}
FILE_OPTIONS = ("tls_ca", "tls_cert", "tls_key", "password_file")
TEXT_OPTIONS = ("tls_server_name", "user")
OPTIONS = (*NUMBER_OPTIONS, *FILE_OPTIONS, *TEXT_OPTIONS)
# option -> the options it needs, and why (checked in this order)
NEEDS = (
    ("tls_cert", "tls_key", "the private key of the client certificate"),
    ("tls_key", "tls_cert", "the client certificate of that private key"),
    ("tls_cert", "tls_ca", "the CA that signed etcd's certificate; TLS to etcd is on only with tls_ca"),
    ("tls_server_name", "tls_ca", "the CA that signed etcd's certificate; TLS to etcd is on only with tls_ca"),
    ("user", "password_file", "the file holding the user's password"),
    ("password_file", "user", "the etcd user the password belongs to"),
)
_SECRET_RE = re.compile(r"(?i)(password=)[^&]*|(//[^/@?]*?:)[^/@?]*(@)")
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
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None
    user: str | None = None
    password_file: str | None = None

    @property
    def tls(self) -> bool:
        """Whether the connection to etcd uses TLS (tls_ca is set)."""
        return self.tls_ca is not None

    @property
    def server_name(self) -> str:
        """The name etcd's certificate must hold: tls_server_name, else the first endpoint's host."""
        return self.tls_server_name or self.endpoints[0][0]

    @property
    def endpoint_text(self) -> str:
        """The endpoints as `host:port,host:port`, for messages."""
        return ",".join(_join_host_port(h, p) for h, p in self.endpoints)

    @property
    def key_prefix(self) -> bytes:
        """The etcd key prefix every key of this cluster starts with (`/prefix/`)."""
        return f"/{self.prefix}/".encode()

    def __str__(self) -> str:
        query = urllib.parse.urlencode(self.options, safe="/")
        return f"etcd://{self.endpoint_text}/{self.prefix}" + (f"?{query}" if query else "")


def redact(uri: str) -> str:
    """The URI with any password (a `password=` option, `user:password@`) replaced by `***`, for messages."""
    return _SECRET_RE.sub(lambda m: f"{m.group(1)}***" if m.group(1) else f"{m.group(2)}***{m.group(3)}", uri)


def read_option_file(option: str, path: str, source: str = "metadata URI option") -> bytes:
    """The content of the file an option names; BadMetadataUriError naming the option and the
    file when it cannot be read or is empty."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise BadMetadataUriError(f"{source} {option}={path}: cannot read the file: {exc.strerror or exc}") from None
    if not data.strip():
        raise BadMetadataUriError(f"{source} {option}={path}: the file is empty")
    return data


def read_secret(option: str, path: str, source: str = "metadata URI option") -> str:
    """A password from the file an option names (read_option_file); only a trailing line break
    is dropped."""
    return read_option_file(option, path, source).decode().rstrip("\r\n")


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
    """Parse a metadata service URI; raise BadMetadataUriError naming what is wrong. Pure: the
    files the options name are read when the store connects (see read_option_file)."""
    if not isinstance(uri, str) or not uri:
        raise BadMetadataUriError("metadata URI is empty; expected etcd://host:port[,host:port...]/prefix")
    shown = redact(uri)
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise BadMetadataUriError(f"metadata URI {shown!r} has no scheme; expected etcd://host:port/prefix")
    if scheme != "etcd":
        raise BadMetadataUriError(f"metadata URI {shown!r}: unsupported scheme {scheme!r}; only 'etcd' is supported")
    rest, _, query = rest.partition("?")
    hosts, slash, prefix = rest.partition("/")
    if "@" in hosts:
        raise BadMetadataUriError(f"metadata URI {shown!r}: credentials before '@' are refused (a URI shows in "
                                  "logs and process lists); use user=NAME&password_file=PATH")
    if not hosts:
        raise BadMetadataUriError(f"metadata URI {shown!r} names no etcd endpoint (host:port)")
    endpoints = tuple(_parse_endpoint(h.strip(), shown) for h in hosts.split(","))
    prefix = prefix.strip("/")
    if not slash or not prefix:
        raise BadMetadataUriError(f"metadata URI {shown!r} has no key prefix; add one, e.g. etcd://{hosts}/pybk")
    if not _PREFIX_RE.match(prefix):
        raise BadMetadataUriError(f"metadata URI {shown!r}: prefix {prefix!r} may hold only letters, digits, "
                                  "'.', '_', '-' and '/' between non-empty parts")
    options: dict = {}
    for name, values in urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=False).items():
        if name == "password":
            raise BadMetadataUriError(f"metadata URI option 'password' is refused: a password in a URI shows in "
                                      f"logs and process lists; write it to a file and pass password_file=PATH "
                                      f"(URI {shown!r})")
        if name not in OPTIONS:
            raise BadMetadataUriError(f"metadata URI {shown!r}: unknown option {name!r}; known: {', '.join(OPTIONS)}")
        options[name] = _option_value(name, values[-1], shown)
    for option, needed, why in NEEDS:
        if option in options and needed not in options:
            raise BadMetadataUriError(f"metadata URI option {option}={options[option]} needs {needed} ({why}); "
                                      f"URI {shown!r}")
    return MetadataUri(endpoints, prefix, options.get("timeout", DEFAULT_TIMEOUT),
                       options.get("lease_ttl", DEFAULT_LEASE_TTL), options,
                       **{name: options.get(name) for name in (*FILE_OPTIONS, *TEXT_OPTIONS)})


def _option_value(name: str, text: str, shown: str):
    """One option's value, checked: numbers positive, names and file paths non-empty."""
    if name not in NUMBER_OPTIONS:
        if not text:
            raise BadMetadataUriError(f"metadata URI {shown!r}: option {name} is empty")
        return text
    kind = NUMBER_OPTIONS[name]
    try:
        value = kind(text)
    except ValueError:
        raise BadMetadataUriError(f"metadata URI {shown!r}: option {name}={text!r} is not a "
                                  f"{kind.__name__}") from None
    if value <= 0:
        raise BadMetadataUriError(f"metadata URI {shown!r}: option {name} must be positive, got {value}")
    return value
