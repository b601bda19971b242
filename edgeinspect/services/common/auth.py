"""The public API's callers: bearer tokens (stored as hashes), a role per token, a rate per token.

One table, METHOD_ROLES, says which token roles may call which method; a role module that adds an RPC adds its
row here (an operator RPC for admins only needs none: admin may call every edgeinspect method). Any method not
in the table is refused to inspect and read tokens; health and reflection need no token (probes, grpcurl list).
Handlers learn who called with `current_caller()`.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass

import grpc

from edgeinspect.config import ApiToken, TokenRole
from edgeinspect.errors import FailedPrecondition, PermissionDenied, ResourceExhausted, Unauthenticated
from edgeinspect.services.common.interceptors import AUTH_EXEMPT_PREFIXES
from edgeinspect.services.common.tls import guarded

log = logging.getLogger(__name__)

TOKEN_PREFIX = "ei_"
_INSPECTION = "/edgeinspect.v1.InspectionService/"
_READ = frozenset({TokenRole.read, TokenRole.inspect})
# method -> token roles that may call it (admin: every /edgeinspect.* method, see `allowed`).
METHOD_ROLES: dict[str, frozenset[TokenRole]] = {
    _INSPECTION + "Inspect": frozenset({TokenRole.inspect}),
    _INSPECTION + "InspectStream": frozenset({TokenRole.inspect}),
    _INSPECTION + "GetReport": _READ,
    _INSPECTION + "ListReports": _READ,
    _INSPECTION + "GetReportImage": _READ,
    _INSPECTION + "AggregateReports": _READ,
    _INSPECTION + "GetCaller": _READ,
    _INSPECTION + "GetClusterStatus": _READ,  # `edgeinspect status`, the console's health line
    # ReviewReport: admin only (not listed); an operator role, when there is one, belongs here.
    # AddToGoodSet, TeachFromReports, PromoteBank: admin only (not listed): a new bank version changes what the gate
    # passes.
}


@dataclass(frozen=True)
class Caller:
    name: str
    role: TokenRole


ANONYMOUS = Caller("anonymous", TokenRole.admin)  # allow_unauthenticated with no tokens: loopback development
_caller: ContextVar[Caller | None] = ContextVar("caller", default=None)


def current_caller() -> Caller | None:
    """Who made the RPC being handled (None outside an authenticated call)."""
    return _caller.get()


def new_token() -> str:
    """A fresh bearer token: 256 random bits."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """'sha256:<hex>': what the gateway's settings hold. Tokens are random 256-bit strings, so a plain hash
    cannot be brute-forced and needs no salt or slow KDF."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def allowed(method: str, role: TokenRole) -> bool:
    """May a token of `role` call `method`? Default deny: unknown methods are admin-only, others refused."""
    if method.startswith(AUTH_EXEMPT_PREFIXES):
        return True
    if role is TokenRole.admin:
        return method.startswith("/edgeinspect.")
    return role in METHOD_ROLES.get(method, frozenset())


class TokenBucket:
    """`rate` calls per second on average, `burst` at once; pure arithmetic over the times it is given."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, float(burst)
        self.tokens, self.stamp = float(burst), None

    def take(self, now: float) -> float:
        """0.0 when a call may go now (and counts it), else the seconds until one may."""
        if self.stamp is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


def _presented(metadata: object) -> str | None:
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """`authorization: Bearer <token>` on every public call: token known and not revoked (UNAUTHENTICATED),
    role allowed for the method (PERMISSION_DENIED), within its rate (RESOURCE_EXHAUSTED with pushback)."""

    def __init__(
        self,
        tokens: list[ApiToken],
        rate_per_s: float,
        burst: int,
        allow_unauthenticated: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._by_hash = {t.hash: t for t in tokens}
        self._anonymous = allow_unauthenticated and not tokens
        self._buckets = {t.hash: TokenBucket(t.rate_per_s or rate_per_s, burst) for t in tokens}
        self._clock = clock

    def _caller(self, metadata: object) -> tuple[Caller, str]:
        presented = _presented(metadata)
        if self._anonymous:
            return ANONYMOUS, ""
        if presented is None:
            raise Unauthenticated("missing bearer token: send metadata 'authorization: Bearer <token>'")
        if not presented:
            raise Unauthenticated("authorization metadata must be 'Bearer <token>'")
        digest = hash_token(presented)
        entry = self._by_hash.get(digest)
        if entry is None:
            raise Unauthenticated("invalid token")
        if entry.revoked:
            raise Unauthenticated(f"token {entry.name!r} was revoked")
        return Caller(entry.name, entry.role), digest

    async def _check(self, context: grpc.aio.ServicerContext, method: str) -> None:
        try:
            caller, digest = self._caller(context.invocation_metadata())
            if not allowed(method, caller.role):
                raise PermissionDenied(f"a {caller.role.value} token may not call {method.rsplit('/', 1)[-1]}")
        except (Unauthenticated, PermissionDenied) as exc:
            log.warning("refused %s from %s: %s", method, context.peer(), exc)
            raise
        if digest:
            wait_s = self._buckets[digest].take(self._clock())
            if wait_s > 0:
                log.info("token %s over its rate on %s", caller.name, method)
                raise ResourceExhausted(
                    f"token {caller.name!r} is over its rate limit; retry in {wait_s:.2f}s",
                    retry_after_ms=max(1, round(wait_s * 1000)),
                )
        # Each RPC runs in its own asyncio task (its own copy of the context): the value ends with the call.
        _caller.set(caller)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(AUTH_EXEMPT_PREFIXES):
            return handler
        return guarded(handler, self._check, method)


def public_auth(
    tokens: list[ApiToken], rate_per_s: float, burst: int, allow_unauthenticated: bool
) -> TokenAuthInterceptor:
    """The public API's interceptor; fails closed: no tokens and no explicit allow_unauthenticated is an error."""
    if not tokens and not allow_unauthenticated:
        raise FailedPrecondition(
            "no api_tokens configured: the public API would accept anyone. Create one with "
            "`edgeinspect token create --role inspect --name NAME` and paste its hash line under api_tokens, "
            "or set allow_unauthenticated: true (loopback development only)"
        )
    if not tokens:
        log.warning("allow_unauthenticated is set and no api_tokens are configured: every caller is admin")
    elif allow_unauthenticated:
        log.info("allow_unauthenticated ignored: api_tokens are configured, so every call needs one")
    live = sum(not t.revoked for t in tokens)
    log.info("public API: %d tokens (%d revoked), %.1f calls/s per token", len(tokens), len(tokens) - live, rate_per_s)
    return TokenAuthInterceptor(tokens, rate_per_s, burst, allow_unauthenticated)
