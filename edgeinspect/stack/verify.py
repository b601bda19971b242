"""`edgeinspect verify`: the A/B check before a line goes live.

Sends a fixed image and prompt through the running cluster (a verification request: greedy, unconstrained, never
stored), then runs the single-process reference (transformers' DeepSeek-VL on the local checkpoint) ONCE,
teacher-forced over the prompt + the cluster's generated tokens, and checks every generated position: the
cluster's token must be the reference's argmax, or its reference logit must lie within the rounding bound of the
cluster's wire codec and weight format below the max logit (a near tie that fp16 / int8 rounding can flip).

Why teacher-forced: free-running sequences of a healthy lossy cluster part at the first flipped near tie and never
meet again (1500 tokens, fp16 wire: apart from token 240), so comparing them cries wolf. Following the cluster's
own tokens, each position is judged on its own, and a box with other weights, drivers or corrupted tensors still
fails at nearly every position. With a lossless cluster (fp32 wire and weights) the bound is 0, so the check is
exact: every position the reference's argmax, which is the same as the free-running greedy sequences being
identical (by induction over positions), without a second, free-running reference pass.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from edgeinspect.errors import FailedPrecondition, InvalidInput


# Per-element rounding error of each format, relative to the values it rounds (edgeinspect/codec.py, DESIGN §3):
# fp16 keeps 11 significant bits (round to nearest: 2^-11 relative), bf16 8 (2^-8); block-int8 errs by at most
# scale / 2 with scale = block absmax / 127 (1/254 of the block's largest value); int8 weights likewise per output
# channel, int4 (q4_0 grid, 16 steps over the absmax range) by 1/16, int6 (64 steps) by 1/64. fp32 on the wire is
# lossless.
class Format(StrEnum):
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"
    int8 = "int8"
    int4 = "int4"
    int6 = "int6"


UNIT_ERROR: dict[str, float] = {
    Format.fp32: 0.0,
    Format.fp16: 2.0**-11,
    Format.bf16: 2.0**-8,
    Format.int8: 1 / 254,
    Format.int4: 1 / 16,
    Format.int6: 1 / 64,
}

# How a unit error grows into a flipped top-1. A flip needs |dz[argmax] - dz[token]| >= margin (the reference's
# max logit - its logit of the cluster's token), so it needs margin <= 2 max|dz|; max|dz| / rms(z) is what rounding
# by one unit error moves the logits, times the model's amplification. Calibrated by bench/verify_bound.py
# (bench/results/verify_bound.json) on the tiny checkpoints (tests/conftest.py TINY and TINY_MHA, 1-5 stages, 4
# sample images x 200 greedy tokens, the cluster as LocalPipeline with the codec on the visual tokens and at every
# stage boundary): max|dz| / rms(z) per unit error was at most 62 (fp16 wire) and 201 (block-int8 wire), and did not
# grow with the stage count (the visual tokens' rounding dominates), so the bound has no per-hop term. Weights round
# every linear: 412 (bf16), 562 (fp16), 686 (int8, fbgemm's 8-bit activations included). The amplifications below
# are those maxima + ~25%. Healthy flips seen: margins up to 0.0012 rms (fp16 wire), 0.35 (int8 wire); a wrong
# checkpoint (seed 7) puts the cluster's tokens at a median margin of 3.1 rms, 10% under 1.7 rms. These tiny
# checkpoints are initialised with std 0.3 (models/tiny.py) and amplify rounding far more than a trained model's
# logits move (DESIGN §4: fp16 at the cut ~1e-4 on the 1.3B shape), so the bound errs on the side of passing.
WIRE_AMPLIFICATION = 250.0
WEIGHT_AMPLIFICATION = 860.0
# Over this bound (in rms) a wrong checkpoint's tokens fall inside it at >10% of positions on the tiny checkpoints:
# verify still fails it, but only at the positions with larger margins; the output says so.
WIDE_BOUND = 1.7


class Decision(StrEnum):
    argmax = "argmax"  # the cluster's token is the reference's top-1 (or an exact tie with it)
    near_tie = "near-tie"  # not the top-1, but within the rounding bound of it
    mismatch = "mismatch"  # beyond what the cluster's formats can explain


def margin_bound(wire: str, weights: str) -> float:
    """The largest reference margin, in units of that position's logit rms, that this cluster's rounding can
    flip: 0 for fp32 wire and weights (the check is then exact)."""
    for name in (wire, weights):
        if name not in UNIT_ERROR:
            raise InvalidInput(f"verify has no rounding bound for format {name!r} (known: {', '.join(UNIT_ERROR)})")
    return 2 * (WIRE_AMPLIFICATION * UNIT_ERROR[wire] + WEIGHT_AMPLIFICATION * UNIT_ERROR[weights])


def judge(margin: float, bound: float) -> Decision:
    """One position: `margin` = reference max logit - reference logit of the cluster's token (>= 0), `bound` in
    logits (margin_bound x that position's rms)."""
    if margin <= 0.0:
        return Decision.argmax
    return Decision.near_tie if margin <= bound else Decision.mismatch


@dataclass(frozen=True)
class PositionCheck:
    position: int  # index among the generated tokens (0 = the first token after the prompt)
    cluster_token: int
    reference_token: int  # the reference's argmax there
    margin: float  # reference logits: max - at the cluster's token
    bound: float  # the margin this cluster's rounding can flip there
    decision: Decision


@dataclass
class TeacherForced:
    """Per generated position, from the reference's logits: its argmax, max - logit of the given token, rms."""

    argmax: list[int]
    margin: list[float]
    rms: list[float]


@dataclass
class VerifyResult:
    checkpoint: str
    fingerprint: str
    cluster_fingerprint: str
    prompt_token_ids: list[int]
    cluster_prompt_ids: list[int]
    cluster_tokens: list[int]
    wire: str  # the cluster's wire codec (from its report)
    weights: str  # the weight format of the stages on the route (least precise one)
    stages: int  # decoder stages on the route
    bound_per_rms: float | None  # None: --tolerance gave the bound in logits
    positions: list[PositionCheck] = field(default_factory=list)  # every position not the argmax
    compared: int = 0  # positions judged
    out_of_vocabulary: int = 0  # cluster tokens the reference's vocabulary does not hold (then nothing is judged)

    @property
    def prompt_matches(self) -> bool:
        return self.cluster_prompt_ids == self.prompt_token_ids

    @property
    def near_ties(self) -> list[PositionCheck]:
        return [p for p in self.positions if p.decision is Decision.near_tie]

    @property
    def mismatches(self) -> list[PositionCheck]:
        return [p for p in self.positions if p.decision is Decision.mismatch]

    @property
    def reasons(self) -> list[str]:
        out = []
        if self.fingerprint != self.cluster_fingerprint:
            out.append(f"checkpoint fingerprints differ: local {self.fingerprint}, cluster {self.cluster_fingerprint}")
        if not self.prompt_matches:
            out.append("the cluster built another prompt (token ids differ): the positions cannot be compared")
        elif not self.cluster_tokens:
            out.append("the cluster generated no tokens")
        elif self.out_of_vocabulary:
            out.append(f"{self.out_of_vocabulary} cluster token(s) lie outside the reference's vocabulary")
        if self.mismatches:
            first = self.mismatches[0]
            out.append(
                f"{len(self.mismatches)} of {self.compared} position(s) beyond the {self.wire}/{self.weights} rounding "
                f"bound, the first at {first.position} (margin {first.margin:.4g} > {first.bound:.4g})"
            )
        return out

    @property
    def agree(self) -> bool:
        return not self.reasons

    @property
    def verdict(self) -> str:
        if not self.agree:
            return "mismatch"
        return "identical" if not self.positions else f"within tolerance at {len(self.near_ties)} near-ties"

    def as_dict(self) -> dict:
        data = asdict(self)
        data.update(agree=self.agree, verdict=self.verdict, reasons=self.reasons, near_ties=len(self.near_ties))
        data["mismatches"] = len(self.mismatches)
        return data


class Reference:
    """The whole model of a checkpoint in this process, through transformers' own from_pretrained."""

    def __init__(self, checkpoint: Path):
        from edgeinspect.models.checkpoint import load_processor, load_reference_model, open_checkpoint

        self.ckpt = open_checkpoint(checkpoint)
        self.processor = load_processor(self.ckpt)
        self.model = load_reference_model(self.ckpt)

    def inputs(self, image_bytes: bytes, instruction: str):
        """(prompt ids, pixel values [1, 3, H, W]) with the prompt the gateway builds for verification."""
        from PIL import Image

        from edgeinspect.models.prompt import build_messages, prompt_text

        text = prompt_text(self.processor, build_messages(instruction))
        image = Image.open(io.BytesIO(image_bytes)).convert("RGB")
        inputs = self.processor(text=text, images=image, return_tensors="pt")
        return inputs["input_ids"][0].tolist(), inputs["pixel_values"]

    def hidden(self, prompt_ids: list[int], pixel_values, tokens: list[int]):
        """[n, D] final hidden states after prompt + tokens[:i] for each i < n = len(tokens): one forward."""
        import torch

        m = self.model.model
        ids = torch.tensor([prompt_ids + tokens[:-1]])  # [1, L]
        p = len(prompt_ids)
        with torch.inference_mode():
            embeds = m.get_input_embeddings()(ids)  # [1, L, D]
            image = m.get_image_features(pixel_values, return_dict=True)  # pyright: ignore[reportCallIssue]
            features = image.pooler_output  # [1, N_img, D]: after the aligner
            # Only the prompt's placeholders take image features: a generated token may be the placeholder id and
            # is embedded plainly, as generate() and the stages do (transformers' forward would count it as a slot).
            slots = torch.zeros_like(ids, dtype=torch.bool)  # [1, L]
            slots[0, :p] = ids[0, :p] == self.ckpt.config.image_token_id
            embeds = embeds.masked_scatter(slots[..., None], features.reshape(-1, embeds.shape[-1]).to(embeds.dtype))
            hidden = m.language_model(inputs_embeds=embeds, attention_mask=torch.ones_like(ids)).last_hidden_state
        return hidden[0, p - 1 :]  # [n, D]: the positions that predict tokens[0..n)

    def teacher_forced(self, prompt_ids: list[int], pixel_values, tokens: list[int], chunk: int = 256) -> TeacherForced:
        """Position i's logits (after prompt + tokens[:i]) judge tokens[i]: argmax, margin of tokens[i], rms."""
        import torch

        hidden = self.hidden(prompt_ids, pixel_values, tokens)  # [n, D]
        want = torch.tensor(tokens)  # [n]
        out = TeacherForced([], [], [])
        with torch.inference_mode():
            for a in range(0, len(tokens), chunk):  # lm_head in chunks: [n, vocab] at 1.3B and 1500 tokens is 600 MB
                z = self.model.lm_head(hidden[a : a + chunk]).float()  # [c, vocab]
                top = z.max(dim=1)
                out.argmax += top.indices.tolist()
                out.margin += (top.values - z.gather(1, want[a : a + chunk, None])[:, 0]).tolist()
                out.rms += z.pow(2).mean(dim=1).sqrt().tolist()
        return out


def check_positions(
    tokens: list[int], tf: TeacherForced, bound_per_rms: float | None, tolerance: float | None = None
) -> list[PositionCheck]:
    """Every position whose token is not the reference's argmax, judged against the bound (`tolerance`: in logits,
    replacing bound_per_rms x rms)."""
    out = []
    for i, (tok, top, margin, rms) in enumerate(zip(tokens, tf.argmax, tf.margin, tf.rms, strict=True)):
        bound = tolerance if tolerance is not None else (bound_per_rms or 0.0) * rms
        decision = judge(max(margin, 0.0), bound)
        if tok != top:
            out.append(PositionCheck(i, tok, top, margin, bound, decision))
    return out


def route_formats(report, status) -> tuple[str, int, str]:
    """(wire codec, stages, least precise weight format) of the route that produced a report."""
    wire = report.model.codec or "fp32"
    # "stage0=host:port[0,3)" (an IPv6 host is bracketed too: the range is the last bracket)
    addresses = [entry.split("=", 1)[1].rsplit("[", 1)[0] for entry in report.model.partition if "=" in entry]
    used = [s.weights for s in status.stages if s.address in addresses and s.weights] if status is not None else []
    weights = max(used or ["fp32"], key=lambda w: UNIT_ERROR.get(w, 1.0))
    return wire, len(addresses) or 1, weights


def verify(
    gateway: str,
    token: str,
    checkpoint: Path,
    image_bytes: bytes,
    instruction: str,
    max_new_tokens: int,
    *,
    weights: str | None = None,
    tolerance: float | None = None,
    ca: Path | None = None,
) -> VerifyResult:
    """`weights`: the stages' weight format (None: as the gateway's cluster status reports them); `tolerance`:
    a margin bound in logits replacing the derived one (e.g. for an int8 ONNX vision node, which it does not
    cover)."""
    import grpc

    from edgeinspect.services.client import InspectionClient
    from edgeinspect.v1 import inspection_pb2

    with InspectionClient(gateway, token, ca=ca) as client:
        request = inspection_pb2.InspectRequest(
            image=image_bytes, prompt=instruction, max_new_tokens=max_new_tokens, verification=True, station="verify"
        )
        report = client.call("Inspect", request)
        status = None
        if weights is None:
            try:
                status = client.call("GetClusterStatus", inspection_pb2.ClusterStatusRequest(), timeout_s=30)
            except grpc.RpcError as err:
                raise FailedPrecondition(
                    f"cannot read the stages' weight format from the gateway's cluster status ({err.code().name}): "
                    "pass --weights"
                ) from None
    wire, stages, route_weights = route_formats(report, status)
    weights = weights or route_weights
    ref = Reference(checkpoint)
    prompt_ids, pixels = ref.inputs(image_bytes, instruction)
    tokens = list(report.generated_token_ids)
    result = VerifyResult(
        checkpoint=str(ref.ckpt.path),
        fingerprint=ref.ckpt.fingerprint,
        cluster_fingerprint=report.model.checkpoint_fingerprint,
        prompt_token_ids=prompt_ids,
        cluster_prompt_ids=list(report.prompt_token_ids),
        cluster_tokens=tokens,
        wire=wire,
        weights=weights,
        stages=stages,
        # an explicit --tolerance replaces the derived bound (also for a format it does not know)
        bound_per_rms=margin_bound(wire, weights) if tolerance is None else None,
    )
    vocab = ref.model.lm_head.out_features  # the reference's logits
    result.out_of_vocabulary = sum(1 for t in tokens if not 0 <= t < vocab)
    if result.prompt_matches and tokens and not result.out_of_vocabulary:
        tf = ref.teacher_forced(prompt_ids, pixels, tokens)
        result.positions = check_positions(tokens, tf, result.bound_per_rms, tolerance)
        result.compared = len(tokens)
    return result
