"""`edgeinspect verify`: the A/B check before a line goes live.

Sends a fixed image and prompt through the running cluster and through a single-process reference
(transformers' generate() on the local checkpoint) and compares the greedy token sequences. Boxes with other
drivers, libraries or corrupted weights can produce garbage while looking healthy; this catches it.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import typer


@dataclass
class VerifyResult:
    checkpoint: str
    fingerprint: str
    cluster_fingerprint: str
    prompt_token_ids: list[int]
    cluster_tokens: list[int]
    reference_tokens: list[int]

    @property
    def agree(self) -> bool:
        return self.cluster_tokens == self.reference_tokens and self.fingerprint == self.cluster_fingerprint


def reference_generate(checkpoint: Path, image_bytes: bytes, instruction: str, max_new_tokens: int):
    """Greedy tokens of the whole model in this process, with the prompt the gateway builds for verification."""
    import torch
    from PIL import Image

    from edgeinspect.models.checkpoint import load_processor, load_reference_model, open_checkpoint
    from edgeinspect.models.prompt import build_messages, prompt_text

    ckpt = open_checkpoint(checkpoint)
    processor = load_processor(ckpt)
    model = load_reference_model(ckpt)
    text = prompt_text(processor, build_messages(instruction))
    inputs = processor(text=text, images=Image.open(io.BytesIO(image_bytes)).convert("RGB"), return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    tokens = out[0, inputs["input_ids"].shape[1] :].tolist()
    eos = ckpt.text_config.eos_token_id
    tokens = tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
    return ckpt, inputs["input_ids"][0].tolist(), tokens


def verify(
    gateway: str, token: str, checkpoint: Path, image_bytes: bytes, instruction: str, max_new_tokens: int
) -> VerifyResult:
    from edgeinspect.services.client import InspectionClient
    from edgeinspect.v1 import inspection_pb2

    with InspectionClient(gateway, token) as client:
        request = inspection_pb2.InspectRequest(
            image=image_bytes, prompt=instruction, max_new_tokens=max_new_tokens, verification=True, station="verify"
        )
        report = client.stub.Inspect(request, metadata=client.metadata, timeout=client.timeout_s)
    ckpt, prompt_ids, ref_tokens = reference_generate(checkpoint, image_bytes, instruction, max_new_tokens)
    if list(report.prompt_token_ids) != prompt_ids:
        # Different prompts make the comparison meaningless: report it as a disagreement with the reason.
        ref_tokens = [-1]
    return VerifyResult(
        str(ckpt.path),
        ckpt.fingerprint,
        report.model.checkpoint_fingerprint,
        prompt_ids,
        list(report.generated_token_ids),
        ref_tokens,
    )


def verify_command(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="the same checkpoint folder the cluster serves"),
    gateway: str = typer.Option("127.0.0.1:50051", envvar="EDGEINSPECT_GATEWAY", help="gateway host:port"),
    token: str = typer.Option("edgeinspect-local", envvar="EDGEINSPECT_API_TOKEN", help="bearer token"),
    image: Path | None = typer.Option(None, help="image to send (default: the shipped sample part)"),
    prompt: str = typer.Option("Inspect the part in the image.", help="instruction text"),
    max_new_tokens: int = typer.Option(32, help="tokens to generate on both sides"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Compare the running cluster's greedy output with a single-process reference; exit 1 when they differ."""
    from rich.console import Console

    from edgeinspect.assets import sample_image

    image_bytes = (image or sample_image()).read_bytes()
    result = verify(gateway, token, checkpoint, image_bytes, prompt, max_new_tokens)
    if as_json:
        print(json.dumps({**asdict(result), "agree": result.agree}))
    else:
        c = Console()
        c.print(
            f"checkpoint   {result.checkpoint}\nfingerprint  local {result.fingerprint}, cluster "
            f"{result.cluster_fingerprint}"
        )
        c.print(f"prompt ids   ({len(result.prompt_token_ids)}) {result.prompt_token_ids}")
        c.print(f"cluster      {result.cluster_tokens}\nreference    {result.reference_tokens}")
        c.print(
            "[green]AGREE[/green]"
            if result.agree
            else "[red]DISAGREE[/red]: the cluster does not reproduce "
            "the reference; check each box's checkpoint, library versions and drivers"
        )
    raise typer.Exit(0 if result.agree else 1)
