"""Security: TLS for every port, who a caller is (tokens, client certificates), what its role
allows, and the throwaway CA of local clusters. docs/security.md states the threat model."""
from .roles import OPEN, Operation, Principal, Role, allowed

__all__ = ["OPEN", "Operation", "Principal", "Role", "allowed"]
