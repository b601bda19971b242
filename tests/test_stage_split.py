"""A model split into stages reproduces transformers' own generate() on the same checkpoint, image and prompt."""

from __future__ import annotations

import pytest
import torch

from edgeinspect.errors import InvalidInput, NotFound, PositionError
from edgeinspect.models.checkpoint import load_processor, load_reference_model, open_checkpoint
from edgeinspect.models.pipeline import LocalPipeline, Request, codec_boundary, even_split, load_local_stages
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped

NEW_TOKENS = 24
INSTRUCTIONS = [
    "Inspect the part in the image.",
    "Is the scratch on the left flange longer than the 5 mm acceptance limit? Answer with the verdict first.",
]


class Oracle:
    """transformers' DeepseekVLForConditionalGeneration.generate() in one process, greedy."""

    def __init__(self, path):
        self.ckpt = open_checkpoint(path)
        self.processor = load_processor(self.ckpt)
        self.model = load_reference_model(self.ckpt)
        self.tower = load_vision_tower(self.ckpt)
        self.preprocess = ImagePreprocessor(self.ckpt)

    def case(self, image, instruction):
        text = prompt_text(self.processor, build_messages(instruction, context="Scratches up to 0.5 mm wide pass."))
        inputs = self.processor(text=text, images=image, return_tensors="pt")
        out = self.model.generate(
            **inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
        n = inputs["input_ids"].shape[1]
        with torch.inference_mode():
            visual = self.tower(self.preprocess(image))[0]
        ids = prompt_ids(self.processor, text)
        assert ids == inputs["input_ids"][0].tolist(), "our prompt ids differ from DeepseekVLProcessor's"
        return ids, visual, out.sequences[0, n:].tolist(), [lg[0] for lg in out.logits]


@pytest.fixture(scope="module", params=["tiny_checkpoint", "tiny_mha_checkpoint"])
def oracle(request):
    return Oracle(request.getfixturevalue(request.param))


@pytest.fixture(scope="module")
def cases(oracle, part_images):
    return [oracle.case(part_images[i], INSTRUCTIONS[i % 2]) for i in range(2)]


def test_reference_output_varies(cases):
    for _, _, tokens, _ in cases:
        assert len(set(tokens)) >= NEW_TOKENS // 3, f"reference output is too repetitive to prove anything: {tokens}"


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_split_reproduces_generate_for_one_session(oracle, cases, stages):
    ids, visual, ref_tokens, ref_logits = cases[0]
    pipe = LocalPipeline(load_local_stages(oracle.ckpt, even_split(oracle.ckpt.num_layers, stages)))
    got = pipe.generate({"s": Request(ids, visual, max_new_tokens=NEW_TOKENS)}, keep_logits=True)["s"]
    assert got.tokens == ref_tokens
    diff = max((a - b).abs().max().item() for a, b in zip(got.logits, ref_logits, strict=True))
    assert diff <= 1e-5, f"logits differ by {diff}"


@pytest.mark.parametrize("stages", [2, 3])
def test_two_sessions_of_different_lengths_stepped_together(oracle, cases, stages):
    assert len(cases[0][0]) != len(cases[1][0])
    pipe = LocalPipeline(load_local_stages(oracle.ckpt, even_split(oracle.ckpt.num_layers, stages)))
    reqs = {f"s{i}": Request(ids, vis, max_new_tokens=NEW_TOKENS) for i, (ids, vis, _, _) in enumerate(cases)}
    got = pipe.generate(reqs, keep_logits=True)
    for i, (_, _, ref_tokens, ref_logits) in enumerate(cases):
        assert got[f"s{i}"].tokens == ref_tokens
        diff = max((a - b).abs().max().item() for a, b in zip(got[f"s{i}"].logits, ref_logits, strict=True))
        assert diff <= 1e-5


def test_fp16_at_the_boundaries_keeps_greedy_tokens(oracle, cases):
    pipe = LocalPipeline(load_local_stages(oracle.ckpt, even_split(oracle.ckpt.num_layers, 3)), codec_boundary("fp16"))
    for ids, visual, ref_tokens, _ in cases:
        assert pipe.generate({"s": Request(ids, visual, max_new_tokens=NEW_TOKENS)})["s"].tokens == ref_tokens


def test_block_int8_at_the_boundaries_has_bounded_error(oracle, cases):
    ids, visual, ref_tokens, ref_logits = cases[0]
    ranges = even_split(oracle.ckpt.num_layers, 3)
    exact = LocalPipeline(load_local_stages(oracle.ckpt, ranges))
    int8 = LocalPipeline(load_local_stages(oracle.ckpt, ranges), codec_boundary("int8"))
    # Teacher-forced: both see the reference tokens, so the logit error is per step, not compounded by divergence.
    err = _teacher_forced_logit_error(exact, int8, ids, visual, ref_tokens)
    free = int8.generate({"s": Request(ids, visual, max_new_tokens=NEW_TOKENS)})["s"].tokens
    agree = sum(a == b for a, b in zip(free, ref_tokens, strict=False)) / len(ref_tokens)
    scale = max(lg.abs().max().item() for lg in ref_logits)
    print(f"block-int8 boundaries: max logit error {err:.4g} (logit scale {scale:.3g}), token agreement {agree:.2f}")
    assert err <= 0.05 * scale
    assert free[0] == ref_tokens[0]


def _teacher_forced_logit_error(a: LocalPipeline, b: LocalPipeline, ids, visual, tokens) -> float:
    la = a.forward([("t", StepInput(position=0, input_ids=torch.tensor(ids), visual_tokens=visual))])[0]
    lb = b.forward([("t", StepInput(position=0, input_ids=torch.tensor(ids), visual_tokens=visual))])[0]
    worst = (la - lb).abs().max().item()
    pos = len(ids)
    for tok in tokens[:-1]:
        step = [("t", StepInput(position=pos, input_ids=torch.tensor([tok])))]
        la, lb = a.forward(step)[0], b.forward(step)[0]
        worst = max(worst, (la - lb).abs().max().item())
        pos += 1
    return worst


def test_step_at_a_wrong_position_is_refused(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    stage = StageExecutor(load_stage(ckpt, LayerRange(0, 2, ckpt.num_layers)))
    stage.step([("s", StepInput(position=0, input_ids=torch.tensor([5, 6, 7])))])
    with pytest.raises(PositionError, match="position 5.*holds 3"):
        stage.step([("s", StepInput(position=5, input_ids=torch.tensor([8])))])
    with pytest.raises(NotFound, match="unknown"):
        stage.step([("other", StepInput(position=4, input_ids=torch.tensor([8])))])
    # The session is intact: the right position still works.
    assert stage.step([("s", StepInput(position=3, input_ids=torch.tensor([8])))])[0].length == 4


def test_visual_tokens_must_match_the_placeholders(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    stage = StageExecutor(load_stage(ckpt, LayerRange(0, 1, ckpt.num_layers)))
    image_id = ckpt.config.image_token_id
    vis_dim = ckpt.config.vision_config.hidden_size
    with pytest.raises(InvalidInput, match="3 image placeholders"):
        stage.step(
            [
                (
                    "s",
                    StepInput(
                        position=0,
                        input_ids=torch.tensor([1, image_id, image_id, image_id]),
                        visual_tokens=torch.zeros(2, vis_dim),
                    ),
                )
            ]
        )
    with pytest.raises(InvalidInput, match="no visual tokens"):
        stage.step([("s", StepInput(position=0, input_ids=torch.tensor([1, image_id])))])
    with pytest.raises(InvalidInput, match="token ids"):
        stage.step([("s", StepInput(position=0, input_ids=torch.tensor([10**6])))])


def test_later_stage_rejects_hidden_states_of_the_wrong_width(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    stage = StageExecutor(load_stage(ckpt, LayerRange(2, 5, ckpt.num_layers)))
    with pytest.raises(InvalidInput, match="hidden states"):
        stage.step([("s", StepInput(position=0, hidden=torch.zeros(3, 7)))])


def test_one_row_steps_take_the_rotary_rows_a_one_position_call_gives(tiny_checkpoint):
    """Decode steps read cos/sin from a table filled a block of positions at a time (StageExecutor._rotary): each
    row must carry the bits transformers' rotary embedding gives for that position alone."""
    ckpt = open_checkpoint(tiny_checkpoint)
    stage = StageExecutor(load_stage(ckpt, LayerRange(0, 1, ckpt.num_layers)))
    rotary = stage.module.rotary_emb
    x = torch.zeros(1, ckpt.config.text_config.hidden_size)
    for position in (0, 1, 255, 256, 257, 700, 5000):
        cos, sin = stage._rotary(x, [(position, 1)])
        want_cos, want_sin = rotary(x, position_ids=torch.tensor([position]))
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin), position
    # Several rows (a prompt) still take the direct call, in their own positions.
    cos, _ = stage._rotary(torch.zeros(3, x.shape[1]), [(10, 3)])
    assert torch.equal(cos, rotary(x, position_ids=torch.arange(10, 13))[0])


@pytest.mark.parametrize("count", [1, 64, 65, 300])  # a decode step's few ids (a Python check) and a prompt's
def test_token_ids_outside_the_vocabulary_are_refused(tiny_checkpoint, count):
    ckpt = open_checkpoint(tiny_checkpoint)
    stage = StageExecutor(load_stage(ckpt, LayerRange(0, 1, ckpt.num_layers)))
    vocab = ckpt.config.text_config.vocab_size
    for bad in (-1, vocab):
        ids = torch.full((count,), 5)
        ids[count // 2] = bad
        with pytest.raises(InvalidInput, match=rf"token ids must lie in \[0, {vocab}\)"):
            stage.step([("s", StepInput(position=0, input_ids=ids))])
    ids = torch.full((count,), vocab - 1)
    assert stage.step([("s", StepInput(position=0, input_ids=ids))])[0].length == count
