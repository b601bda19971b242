"""mTLS vs plaintext on loopback at the DeepSeek-VL 1.3B wire shapes: per decode token and on time to first token.

A server process (our start_server: interceptors, caller-role check on the mTLS side) echoes tensor frames on two
ports, plaintext and mTLS, over one bidi stream each, as a decoder stage's Forward does. The client (our
make_channel) alternates the two in rounds, so both see the same load. Shapes: a decode step's hidden state
[1, 2048] fp16 (4 KB) each way; the visual tokens [576, 1024] fp16 (1.18 MB) and prefill chunks [128, 2048] fp16
(512 KB) up with a small reply, as in prefill.

The per-token figure the target applies to: the time TLS adds to one gateway-driven decode token over S stages
(S round trips), over the decode time per token at 1.3B recorded by bench/perf_report.py (int8, the fastest
decode, so the least favourable ratio), with the same-run transport ratio beside it.

    .venv/bin/python bench/tls_overhead.py          # -> bench/results/tls_overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py when run as a script
from common import RESULTS_DIR, load_average, machine_info, target, write_json  # noqa: E402

from edgeinspect import certs  # noqa: E402
from edgeinspect.config import ServerConfig, TLSConfig  # noqa: E402

ECHO, SINK = "/bench.Wire/Echo", "/bench.Wire/Sink"
HIDDEN = 2048  # DeepSeek-VL 1.3B hidden size
VISUAL = (576, 1024)  # visual tokens before the aligner
PREFILL_CHUNK = 128  # the gateway's default prefill_chunk_tokens
PROMPT_TOKENS = 974  # the inspection prompt bench/perf_report.py measures
STAGES = 2


def _identity(b: bytes) -> bytes:
    return b


async def _echo(requests, context):
    async for frame in requests:
        yield frame


async def _sink(requests, context):
    async for frame in requests:
        yield frame[:16]


def _handler() -> grpc.GenericRpcHandler:
    methods = {
        "Echo": grpc.stream_stream_rpc_method_handler(_echo, _identity, _identity),
        "Sink": grpc.stream_stream_rpc_method_handler(_sink, _identity, _identity),
    }
    return grpc.method_handlers_generic_handler("bench.Wire", methods)


async def _serve(tls_dir: Path) -> None:
    from edgeinspect.services.common.server import start_server

    add = [lambda s: s.add_generic_rpc_handlers((_handler(),))]
    plain = await start_server(add, [], ServerConfig(max_message_mb=64), role="stage")
    mtls = TLSConfig(cert=tls_dir / "stage.crt", key=tls_dir / "stage.key", ca=tls_dir / "ca.crt")
    secure = await start_server(add, [], ServerConfig(max_message_mb=64, tls=mtls), role="stage")
    print(json.dumps({"plain": plain.port, "mtls": secure.port}), flush=True)
    await asyncio.Event().wait()


def _frame(shape: tuple[int, int]) -> bytes:
    """A real TensorFrame (our codec, fp16, crc) of random values, serialized."""
    import torch

    from edgeinspect import codec

    return codec.encode_frame(torch.randn(*shape), codec.Codec.fp16).SerializeToString()


class Stream:
    """One open bidi stream; `round_trip` sends a message and waits for its reply."""

    def __init__(self, address: str, method: str, tls: TLSConfig | None) -> None:
        from edgeinspect.services.common.channel import make_channel

        self.channel = make_channel(address, 64, tls)
        self.call = self.channel.stream_stream(method, _identity, _identity)()

    async def round_trip(self, payload: bytes) -> float:
        t0 = time.perf_counter()
        await self.call.write(payload)
        await self.call.read()
        return time.perf_counter() - t0

    async def close(self) -> None:
        await self.call.done_writing()
        await self.channel.close()


async def _measure(ports: dict, tls: TLSConfig, rounds: int, decode_msgs: int) -> dict:
    hidden, visual, chunk = _frame((1, HIDDEN)), _frame(VISUAL), _frame((PREFILL_CHUNK, HIDDEN))
    streams = {}
    for name, port, creds in (("plain", ports["plain"], None), ("mtls", ports["mtls"], tls)):
        streams[name] = (Stream(f"127.0.0.1:{port}", ECHO, creds), Stream(f"127.0.0.1:{port}", SINK, creds))
    samples: dict[str, dict[str, list[float]]] = {n: {"decode": [], "visual": [], "chunk": []} for n in streams}
    for echo, sink in streams.values():  # warm: handshakes done, buffers grown
        for _ in range(200):
            await echo.round_trip(hidden)
        for _ in range(5):
            await sink.round_trip(visual)
            await sink.round_trip(chunk)
    for r in range(rounds):
        order = ["plain", "mtls"] if r % 2 == 0 else ["mtls", "plain"]
        for name in order:
            echo, sink = streams[name]
            times = [await echo.round_trip(hidden) for _ in range(decode_msgs)]
            samples[name]["decode"].append(statistics.median(times))
            samples[name]["visual"].append(statistics.median([await sink.round_trip(visual) for _ in range(5)]))
            samples[name]["chunk"].append(statistics.median([await sink.round_trip(chunk) for _ in range(5)]))
    for echo, sink in streams.values():
        await echo.close()
        await sink.close()
    return {
        name: {kind: statistics.median(v) for kind, v in kinds.items()} | {"rounds": kinds}
        for name, kinds in samples.items()
    }


def _recorded_decode_and_ttft() -> dict:
    """The 1.3B decode time per token and TTFT (vision + prefill) bench/perf_report.py recorded (int8)."""
    path = RESULTS_DIR / "perf_report.json"
    ours = json.loads(path.read_text())["ours"]
    return {
        "source": str(path.relative_to(RESULTS_DIR.parent.parent)),
        "decode_ms_per_token": ours["decode_ms_per_token"],
        "ttft_s": ours["vision_s"] + ours["prefill_s"],
        "prompt_tokens": ours["prompt_tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10, help="alternating plaintext/mTLS rounds")
    ap.add_argument("--decode-msgs", type=int, default=300, help="decode-step round trips per round")
    ap.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return

    machine = machine_info(bandwidth=False)
    with tempfile.TemporaryDirectory() as tmp:
        tls_dir = Path(tmp)
        ca = certs.make_ca()
        certs.write_ca(tls_dir, ca)
        for role in ("stage", "gateway"):
            certs.write_issued(tls_dir, role, certs.issue(ca, role, [role], ips=["127.0.0.1"]), tls_dir / "ca.crt")
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(tls_dir)], stdout=subprocess.PIPE, text=True
        )
        try:
            ports = json.loads(server.stdout.readline())
            client_tls = TLSConfig(cert=tls_dir / "gateway.crt", key=tls_dir / "gateway.key", ca=tls_dir / "ca.crt")
            measured = asyncio.run(_measure(ports, client_tls, args.rounds, args.decode_msgs))
        finally:
            server.terminate()
            server.wait(10)

    plain, mtls = measured["plain"], measured["mtls"]
    recorded = _recorded_decode_and_ttft()
    added_us = (mtls["decode"] - plain["decode"]) * 1e6  # one round trip of a decode step's hidden state
    per_token_added_ms = STAGES * added_us / 1e3  # gateway-driven: one round trip per stage per token
    chunks = -(-recorded["prompt_tokens"] // PREFILL_CHUNK)
    # TTFT on the wire: the visual tokens to stage 0 once, then every prefill chunk through each stage hop.
    ttft_added_ms = ((mtls["visual"] - plain["visual"]) + STAGES * chunks * (mtls["chunk"] - plain["chunk"])) * 1e3
    payload = {
        "benchmark": "tls_overhead",
        "machine": machine | {"loadavg_end": load_average()},
        "shapes": {
            "hidden_state": [1, HIDDEN],
            "visual_tokens": list(VISUAL),
            "prefill_chunk": [PREFILL_CHUNK, HIDDEN],
        },
        "codec": "fp16",
        "stages": STAGES,
        "rounds": args.rounds,
        "decode_msgs_per_round": args.decode_msgs,
        "round_trip_us": {
            n: {k: round(v * 1e6, 1) for k, v in m.items() if k != "rounds"} for n, m in measured.items()
        },
        "decode_round_trip_mtls_vs_plaintext": round(mtls["decode"] / plain["decode"], 4),
        "added_us_per_decode_round_trip": round(added_us, 1),
        "added_ms_per_token": round(per_token_added_ms, 4),
        "added_ms_on_ttft": round(ttft_added_ms, 3),
        "recorded_1p3b": recorded,
        "targets": {
            "tls_added_per_token_vs_decode_token": target(
                per_token_added_ms / recorded["decode_ms_per_token"], 0.02, higher_is_better=False
            ),
            "tls_added_on_ttft_vs_ttft": target(
                ttft_added_ms / (recorded["ttft_s"] * 1e3), 0.02, higher_is_better=False
            ),
        },
        "rounds_s": {n: m["rounds"] for n, m in measured.items()},
    }
    path = write_json("tls_overhead", payload)
    print(
        json.dumps(
            {k: payload[k] for k in ("round_trip_us", "added_ms_per_token", "added_ms_on_ttft", "targets")}, indent=1
        )
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
