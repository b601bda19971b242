"""Who is calling the public API and whether their role may review reports (pure policy + one seam).

The seam: `caller_of` asks the auth layer for the verified token's (name, role). Until token roles exist, every
token the bearer interceptor accepted is one unnamed operator (the only kind of token there is).
"""

from __future__ import annotations

from dataclasses import dataclass

REVIEW_ROLES = frozenset({"admin", "operator"})


@dataclass(frozen=True)
class CallerInfo:
    name: str
    role: str


def may_review(role: str) -> bool:
    return role in REVIEW_ROLES


def caller_of(context: object) -> CallerInfo:
    """The caller of the current RPC (the auth interceptor has accepted it already)."""
    try:
        from edgeinspect.services.common.auth import current_caller
    except ImportError:  # token roles have not landed: one kind of token, which operates the line
        return CallerInfo("", "operator")
    name, role = current_caller()
    return CallerInfo(name, role)
