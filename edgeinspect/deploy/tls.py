"""The rendered plant's certificates: one per box from the plant CA, mounted as secrets where every role of that
box finds it at the same path (compose secrets, a Kubernetes Secret per box).

Rendering stays pure: settings and manifests only name the mounted paths. `issue` makes the certificates (random
keys) in a separate step, written beside the rendered files as secret files (0600), never inside a YAML.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from edgeinspect import certs
from edgeinspect.config import TLSConfig
from edgeinspect.deploy.inventory import Box, Inventory, Role
from edgeinspect.deploy.topology import Instance

# Where a role's container sees its box's certificate, key and the plant CA (compose and Kubernetes alike).
MOUNT = "/run/secrets/edgeinspect-tls"
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "box.crt", "box.key"
SECRETS_DIR = "secrets/tls"  # beside each rendered folder's compose.yaml / kustomization.yaml


def mounted(name: str) -> str:
    return f"{MOUNT}/{name}"


def server_tls(inst: Instance) -> TLSConfig:
    """Internal roles require a plant certificate from their callers; the gateway's public API takes tokens."""
    return TLSConfig(
        cert=Path(mounted(CERT_FILE)),
        key=Path(mounted(KEY_FILE)),
        ca=Path(mounted(CA_FILE)),
        require_client_auth=inst.role is not Role.gateway,
    )


def client_tls() -> TLSConfig:
    """What a role presents to the roles it calls: its box's certificate."""
    return TLSConfig(cert=Path(mounted(CERT_FILE)), key=Path(mounted(KEY_FILE)), ca=Path(mounted(CA_FILE)))


def public_ca() -> TLSConfig:
    """What a client of the public API (ingest) needs: the plant CA, to verify the gateway."""
    return TLSConfig(ca=Path(mounted(CA_FILE)))


def healthcheck_args() -> list[str]:
    """`edgeinspect healthcheck` over mTLS with the box's own certificate (health admits any plant role)."""
    return ["--ca", mounted(CA_FILE), "--cert", mounted(CERT_FILE), "--key", mounted(KEY_FILE)]


def box_names(inv: Inventory, box: Box, insts: list[Instance]) -> tuple[list[str], list[str]]:
    """(DNS names, IPs) a box's roles are reached by: its address, name, compose service and Kubernetes Service
    names, and loopback (its own healthchecks)."""
    ns = f"edgeinspect-{inv.plant.name}"
    services = [i.service for i in insts if i.box.name == box.name]
    dns = [box.name, "localhost"]
    for svc in services:
        dns += [svc, f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local"]
    ips = ["127.0.0.1"]
    try:
        ips.append(str(ipaddress.ip_address(box.address)))
    except ValueError:
        dns.append(box.address)
    return list(dict.fromkeys(dns)), list(dict.fromkeys(ips))


def issue(inv: Inventory, insts: list[Instance], ca: certs.Issued, days: int) -> dict[str, certs.Issued]:
    """One certificate per box, naming every plant role the box runs (PostgreSQL, no plant role, serves its box's
    certificate without one)."""
    out = {}
    for box in inv.boxes:
        dns, ips = box_names(inv, box, insts)
        roles = [r.value for r in box.roles if r.value in certs.ROLES]
        out[box.name] = certs.issue(ca, dns[0], roles, hosts=dns[1:], ips=ips, days=days)
    return out


def write(folder: Path, ca_cert: bytes, issued: dict[str, certs.Issued]) -> list[Path]:
    """folder/secrets/tls/{ca.crt, BOX.crt, BOX.key (0600)} for the boxes in `issued`."""
    tls_dir = folder / SECRETS_DIR
    tls_dir.mkdir(parents=True, exist_ok=True)
    (tls_dir / CA_FILE).write_bytes(ca_cert)
    written = [tls_dir / CA_FILE]
    for box, cert in issued.items():
        paths = certs.write_issued(tls_dir, box, cert, tls_dir / CA_FILE)
        written += [paths.cert, paths.key]
    return written
