"""mTLS between the roles: credentials from settings, and which caller roles each service admits.

A server with `tls.require_client_auth` completes a handshake only with a certificate signed by its CA (a
plaintext client or one from another CA never gets an RPC through); the interceptor here then admits the call
only when the certificate names a role allowed to call this service (its SAN URIs, edgeinspect.certs).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc

from edgeinspect import certs
from edgeinspect.config import TLSConfig
from edgeinspect.errors import PermissionDenied, Unauthenticated
from edgeinspect.services.common.interceptors import AUTH_EXEMPT_PREFIXES, _kind, _rebuild

log = logging.getLogger(__name__)

# Who may call each internal service: the gateway drives everything, every decoder stage included.
CALLERS: dict[str, frozenset[str]] = {
    "stage": frozenset({"gateway"}),
    "vision": frozenset({"gateway"}),
    "retrieval": frozenset({"gateway"}),
}

Check = Callable[[grpc.aio.ServicerContext, str], Awaitable[None]]


def _read(path: Any) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def server_credentials(tls: TLSConfig) -> grpc.ServerCredentials:
    """The server's certificate; with require_client_auth, callers must present one signed by `tls.ca`."""
    if tls.cert is None or tls.key is None:
        raise ValueError("a TLS server needs tls.cert and tls.key")
    if tls.require_client_auth and tls.ca is None:
        raise ValueError("tls.require_client_auth needs tls.ca (the CA that signs the callers' certificates)")
    return grpc.ssl_server_credentials(
        [(_read(tls.key), _read(tls.cert))],
        root_certificates=_read(tls.ca) if tls.ca is not None else None,
        require_client_auth=tls.require_client_auth,
    )


def channel_credentials(tls: TLSConfig) -> grpc.ChannelCredentials:
    """Client credentials: verify the server against `tls.ca`; present our own certificate when we have one."""
    mine = tls.cert is not None and tls.key is not None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca) if tls.ca is not None else None,
        private_key=_read(tls.key) if mine else None,
        certificate_chain=_read(tls.cert) if mine else None,
    )


@functools.lru_cache(maxsize=256)
def _roles_of(pem: bytes) -> frozenset[str]:
    return frozenset(certs.roles_of(pem))


def peer_roles(context: grpc.aio.ServicerContext) -> frozenset[str] | None:
    """The roles in the caller's verified certificate; None when the call came without one."""
    pems = context.auth_context().get("x509_pem_cert")
    if not pems:
        return None
    return _roles_of(next(iter(pems)))  # grpc's stub types the values as Iterable[bytes]; they are lists


def guarded(handler: grpc.RpcMethodHandler, check: Check, method: str) -> grpc.RpcMethodHandler:
    """The same handler, running `check(context, method)` first (it raises a typed error to refuse the call)."""
    behavior = getattr(handler, _kind(handler))
    if inspect.isasyncgenfunction(behavior):

        async def stream(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(context, method)
            async for response in behavior(request_or_iterator, context):
                yield response

        return _rebuild(handler, stream)

    async def unary(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(context, method)
        result = behavior(request_or_iterator, context)
        return await result if inspect.isawaitable(result) else result

    return _rebuild(handler, unary)


class PeerRoleInterceptor(grpc.aio.ServerInterceptor):
    """Admits a call only when the caller's certificate names one of `allowed` (None: any certificate from the
    CA). Health and reflection stay open to every certificate the handshake accepted (probes, grpcurl list)."""

    def __init__(self, service_role: str, allowed: Iterable[str] | None) -> None:
        self._role = service_role
        self._allowed = frozenset(allowed) if allowed is not None else None

    async def _check(self, context: grpc.aio.ServicerContext, method: str) -> None:
        roles = peer_roles(context)
        if not roles:
            why = "no client certificate" if roles is None else "a certificate that names no edgeinspect role"
            log.warning("refused %s from %s: %s", method, context.peer(), why)
            raise Unauthenticated("a client certificate from the plant CA naming an edgeinspect role is required")
        if self._allowed is not None and not roles & self._allowed:
            names = ",".join(sorted(roles))
            log.warning("refused %s from %s: role %s may not call the %s", method, context.peer(), names, self._role)
            raise PermissionDenied(
                f"role {names} may not call the {self._role} (admitted: {', '.join(sorted(self._allowed))})"
            )

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


def peer_interceptors(role: str, tls: TLSConfig | None) -> list[grpc.aio.ServerInterceptor]:
    """What start_server adds for `tls`: role checks when callers must present certificates, else nothing."""
    if tls is None or not tls.require_client_auth:
        return []
    allowed = tls.allowed_roles if tls.allowed_roles is not None else CALLERS.get(role)
    return [PeerRoleInterceptor(role, allowed)]
