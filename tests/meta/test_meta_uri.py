"""Metadata service URIs parse, and bad ones get an error naming what is wrong."""
import pytest

from pybk.meta import BadMetadataUriError, parse_uri


def test_uri_with_several_endpoints_and_options_parses():
    u = parse_uri("etcd://10.0.0.1:2379,etcd-1.example:2380,[::1]:2381/pybk/prod?timeout=2.5&lease_ttl=4")
    assert u.endpoints == (("10.0.0.1", 2379), ("etcd-1.example", 2380), ("::1", 2381))
    assert u.prefix == "pybk/prod" and u.key_prefix == b"/pybk/prod/"
    assert (u.timeout, u.lease_ttl) == (2.5, 4)
    assert u.endpoint_text == "10.0.0.1:2379,etcd-1.example:2380,[::1]:2381"
    assert parse_uri(str(u)) == u


def test_uri_defaults():
    u = parse_uri("etcd://localhost/pybk")
    assert u.endpoints == (("localhost", 2379),) and u.timeout == 5.0 and u.lease_ttl == 10


@pytest.mark.parametrize("uri, says", [
    ("", "empty"),
    ("127.0.0.1:2379/pybk", "no scheme"),
    ("zk://127.0.0.1:2181/ledgers", "unsupported scheme 'zk'"),
    ("etcd:///pybk", "names no etcd endpoint"),
    ("etcd://127.0.0.1:2379", "no key prefix"),
    ("etcd://127.0.0.1:2379/", "no key prefix"),
    ("etcd://127.0.0.1:99999/pybk", "port '99999'"),
    ("etcd://127.0.0.1:abc/pybk", "port 'abc'"),
    ("etcd://127.0.0.1:/pybk", "empty port"),
    ("etcd://a:1,,b:2/pybk", "empty endpoint"),
    ("etcd://[::1:2379/pybk", "closing ']'"),
    ("etcd://bad host:1/pybk", "'bad host' is not a valid host"),
    ("etcd://h:1/pybk?colour=red", "unknown option 'colour'"),
    ("etcd://h:1/pybk?timeout=soon", "timeout='soon' is not a float"),
    ("etcd://h:1/pybk?lease_ttl=0", "lease_ttl must be positive"),
    ("etcd://h:1/py bk", "prefix 'py bk'"),
    ("etcd://h:1/a//b", "prefix 'a//b'"),
    ("etcd://h:1/pybk?tls_cert=/c.crt&tls_ca=/ca.crt", "option tls_cert=/c.crt needs tls_key"),
    ("etcd://h:1/pybk?tls_key=/c.key&tls_ca=/ca.crt", "option tls_key=/c.key needs tls_cert"),
    ("etcd://h:1/pybk?tls_cert=/c.crt&tls_key=/c.key", "option tls_cert=/c.crt needs tls_ca"),
    ("etcd://h:1/pybk?tls_server_name=etcd", "option tls_server_name=etcd needs tls_ca"),
    ("etcd://h:1/pybk?user=pybk", "option user=pybk needs password_file"),
    ("etcd://h:1/pybk?password_file=/pw", "option password_file=/pw needs user"),
    ("etcd://h:1/pybk?tls_ca=", "option tls_ca is empty"),
])
def test_bad_uri_error_names_the_problem(uri, says):
    with pytest.raises(BadMetadataUriError) as err:
        parse_uri(uri)
    assert says in str(err.value)


def test_uri_security_options_parse_and_print_back():
    text = ("etcd://etcd.pybk.svc:2379/pybk?tls_ca=/etc/pybk/etcd/ca.crt&tls_cert=/etc/pybk/etcd/tls.crt"
            "&tls_key=/etc/pybk/etcd/tls.key&user=pybk&password_file=/etc/pybk/etcd/password")
    u = parse_uri(text)
    assert (u.tls_ca, u.tls_cert, u.tls_key) == ("/etc/pybk/etcd/ca.crt", "/etc/pybk/etcd/tls.crt",
                                                 "/etc/pybk/etcd/tls.key")
    assert (u.user, u.password_file, u.tls, u.server_name) == ("pybk", "/etc/pybk/etcd/password", True,
                                                               "etcd.pybk.svc")
    assert str(u) == text and parse_uri(str(u)) == u
    assert parse_uri(text + "&tls_server_name=etcd-0").server_name == "etcd-0"
    assert not parse_uri("etcd://h/pybk").tls


@pytest.mark.parametrize("uri", [
    "etcd://h:1/pybk?user=pybk&password=hunter2-secret",
    "etcd://pybk:hunter2-secret@h:1/pybk",
    "etcd://h:1/pybk?password=hunter2-secret&colour=red",
])
def test_password_in_the_uri_is_refused_without_repeating_it(uri):
    with pytest.raises(BadMetadataUriError) as err:
        parse_uri(uri)
    first = str(err.value).splitlines()[0]
    assert "password" in first and ("password_file=PATH" in first)
    assert "hunter2-secret" not in str(err.value)
