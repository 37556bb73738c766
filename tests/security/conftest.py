"""Security tests run real `pybk bookie` processes with certificates from a throwaway CA
(pybk.security.ca) and an auth file giving one token per role (security_helpers.Pki)."""
from __future__ import annotations

import pytest

from security_helpers import Pki, make_pki


@pytest.fixture
def pki(tmp_path) -> Pki:
    """A CA, the bookies' identity (CN pybk-bookie) and reader, writer and admin tokens."""
    return make_pki(tmp_path / "pki")
