"""The OPC UA server with Basic256Sha256 (Sign & Encrypt): a PLC with a trusted certificate runs the handshake,
a client without one, or with a certificate the station does not trust, never gets a session.

The cycle runner here answers at once (no camera, no gateway): what is under test is the transport security of
the real LineServer and the real asyncua client; the full cycle runs in test_line_e2e.py."""

from __future__ import annotations

import socket

import pytest
from asyncua.crypto.cert_gen import setup_self_signed_certificate
from cryptography.x509.oid import ExtendedKeyUsageOID

from edgeinspect.services.line.config import OpcUaConfig, StationLineConfig
from edgeinspect.services.line.handshake import Outcome
from edgeinspect.services.line.journal import CycleJournal
from edgeinspect.services.line.opcua import LineServer, LineStation
from edgeinspect.services.line.plcsim import PlcSim
from edgeinspect.services.line.testing import free_port


async def make_cert(folder, name: str, use) -> tuple:
    """A self-signed certificate in `folder` (a trust folder holds certificates only: the key goes beside it)."""
    keys = folder.parent / "keys"
    keys.mkdir(exist_ok=True)
    key, cert = keys / f"{name}.pem", folder / f"{name}.der"
    await setup_self_signed_certificate(
        key, cert, f"urn:edgeinspect:{name}", socket.gethostname(), [use], {"organizationName": "edgeinspect"}
    )
    return cert, key


async def answer(station, start, recipe, lot) -> Outcome:
    return Outcome(start.cycle, verdict="OK", report_id=f"r-{start.cycle}")


@pytest.fixture
async def secure_server(tmp_path):
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (tmp_path / "server").mkdir()
    server_cert, server_key = await make_cert(tmp_path / "server", "server", ExtendedKeyUsageOID.SERVER_AUTH)
    plc_cert, plc_key = await make_cert(trusted, "plc", ExtendedKeyUsageOID.CLIENT_AUTH)
    cfg = OpcUaConfig(
        port=free_port(),
        security="basic256sha256",
        certificate=server_cert,
        private_key=server_key,
        trusted_clients=trusted,
        journal=tmp_path / "line.sqlite",
    )
    journal = CycleJournal(cfg.journal)
    station = LineStation("station-s", "cam-s", StationLineConfig(result_deadline_ms=2000))
    server = await LineServer(cfg, [station], answer, journal).start()
    try:
        yield server, (plc_cert, plc_key), tmp_path
    finally:
        await server.stop()
        journal.close()


async def test_a_trusted_plc_certificate_runs_the_handshake_encrypted(secure_server):
    server, (cert, key), _ = secure_server
    async with PlcSim(server.endpoint, "station-s", certificate=cert, private_key=key) as plc:
        cycle = await plc.cycle(result_timeout_s=10)
    assert cycle.ok and cycle.report_id == "r-1" and cycle.error == 0


async def test_a_client_without_security_or_with_an_untrusted_certificate_gets_no_session(secure_server):
    server, _, folder = secure_server
    with pytest.raises(Exception):  # noqa: B017 (asyncua raises several types for a refused session)
        async with PlcSim(server.endpoint, "station-s") as plc:
            await plc.read("TriggerReady")
    (folder / "untrusted").mkdir()
    stranger_cert, stranger_key = await make_cert(folder / "untrusted", "stranger", ExtendedKeyUsageOID.CLIENT_AUTH)
    with pytest.raises(Exception):  # noqa: B017
        async with PlcSim(server.endpoint, "station-s", certificate=stranger_cert, private_key=stranger_key) as plc:
            await plc.read("TriggerReady")
