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
])
def test_bad_uri_error_names_the_problem(uri, says):
    with pytest.raises(BadMetadataUriError) as err:
        parse_uri(uri)
    assert says in str(err.value)
