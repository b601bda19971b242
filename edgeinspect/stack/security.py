"""The embedded stack's credentials (`up`, LocalStack): its API token and, with `up --tls`, a CA + one cert per role.

The launcher asks here for each role's server and client TLS settings, so the stack tests run exactly the
mTLS path a plant runs. The token is written once to WORKDIR/api_token (0600) and reused by later `up`s, so
scripts and `edgeinspect inspect` keep working across restarts; only its hash reaches the gateway's run config.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from edgeinspect import certs
from edgeinspect.config import ApiToken, TLSConfig, TokenRole
from edgeinspect.services.common.auth import hash_token, new_token
from edgeinspect.services.common.tls import channel_credentials

log = logging.getLogger(__name__)

TOKEN_FILE = "api_token"
TLS_DIR = "tls"
STACK_ROLES = ("vision", "stage", "retrieval", "gateway")
_INSTANCE = re.compile(r"^([a-z]+?)\d*(?:r\d+)?$")  # stage0r1 -> stage


def role_of(name: str) -> str:
    """The role of a stack process name: vision, stage0, stage0r1, retrieval, gateway."""
    match = _INSTANCE.match(name)
    if match is None or match.group(1) not in STACK_ROLES:
        raise ValueError(f"{name!r} is not a stack role name")
    return match.group(1)


def read_token_file(path: Path) -> str | None:
    """The token in `path` (first line), or None when the file is missing or empty."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        return None
    return token or None


@dataclass(frozen=True)
class StackCredentials:
    token: str
    token_file: Path
    tls_dir: Path | None  # None: plaintext on loopback

    @property
    def ca(self) -> Path | None:
        return self.tls_dir / certs.CA_CERT if self.tls_dir is not None else None

    def api_tokens(self) -> list[ApiToken]:
        """What the gateway accepts: the stack's one admin token, as its hash."""
        return [ApiToken(name="embedded", role=TokenRole.admin, hash=hash_token(self.token))]

    def _files(self, role: str, **kw: Any) -> TLSConfig | None:
        if self.tls_dir is None:
            return None
        return TLSConfig(cert=self.tls_dir / f"{role}.crt", key=self.tls_dir / f"{role}.key", ca=self.ca, **kw)

    def server_tls(self, name: str) -> TLSConfig | None:
        """Internal roles: mTLS admitting their callers; the gateway: TLS, callers show tokens instead."""
        role = role_of(name)
        return self._files(role, require_client_auth=role != "gateway")

    def client_tls(self, name: str) -> TLSConfig | None:
        """What a role presents to the roles it calls (the gateway)."""
        return self._files(role_of(name))

    def public_tls(self) -> TLSConfig | None:
        """What a client of the public API needs: the CA to verify the gateway."""
        return TLSConfig(ca=self.ca) if self.tls_dir is not None else None

    def probe_channel(self, address: str) -> grpc.Channel:
        """A blocking channel that health-checks any role of the stack (the gateway's certificate opens every
        internal role's handshake; health needs no particular role)."""
        tls = self._files("gateway")
        if tls is None:
            return grpc.insecure_channel(address)
        return grpc.secure_channel(address, channel_credentials(tls))


def stack_credentials(workdir: Path, tls: bool, host: str, token: str = "") -> StackCredentials:
    """The token (given, else WORKDIR/api_token, else a new one written there) and, with `tls`, the stack's CA
    and role certificates under WORKDIR/tls (made on first use; certificates reissued every start)."""
    token_file = workdir / TOKEN_FILE
    token = token or read_token_file(token_file) or new_token()
    if read_token_file(token_file) != token:
        certs.write_secret(token_file, (token + "\n").encode())
    tls_dir = None
    if tls:
        tls_dir = workdir / TLS_DIR
        ca = certs.ensure_ca(tls_dir)
        ips = [host] if _is_ip(host) else []
        for role in STACK_ROLES:
            issued = certs.issue(ca, role, [role], hosts=["localhost", *([] if ips else [host])], ips=ips)
            certs.write_issued(tls_dir, role, issued, tls_dir / certs.CA_CERT)
    return StackCredentials(token=token, token_file=token_file, tls_dir=tls_dir)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
