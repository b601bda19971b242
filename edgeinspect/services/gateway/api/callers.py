"""Who is calling the public API and whether their token's role may review reports.

Review is a decision about the product, so the read and inspect roles (viewers, cameras) may not make one; the
auth interceptor's METHOD_ROLES refuses them first, this is the servicer's own check of the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeinspect.services.common.auth import current_caller

REVIEW_ROLES = frozenset({"admin", "operator"})


@dataclass(frozen=True)
class CallerInfo:
    name: str
    role: str


def may_review(role: str) -> bool:
    return role in REVIEW_ROLES


def caller_of(context: object) -> CallerInfo:
    """The caller of the current RPC; without an auth interceptor (no token checked) a nameless reader."""
    caller = current_caller()
    if caller is None:
        return CallerInfo("", "read")
    return CallerInfo(caller.name, str(caller.role))
