"""A flagged part's evidence (issue 65): the crop is cut from the full-resolution frame around the gate's regions, the
reference is the nearest good kept frame, the prompt gives each image its own placeholders and caption exactly as
transformers' processor does, and the images' visual tokens join in the prompt's order."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from edgeinspect import codec
from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.services.gateway import evidence
from edgeinspect.v1 import inspection_pb2, vision_pb2

W, H = 2400, 1800  # a camera frame, far above the 384 px the vision processor squashes it to


def _png(frame: np.ndarray) -> bytes:
    return cv2.imencode(".png", frame)[1].tobytes()


def _region(x: float, y: float, w: float, h: float) -> vision_pb2.AnomalyRegion:
    return vision_pb2.AnomalyRegion(x=x, y=y, width=w, height=h)


def test_the_crop_box_pads_the_flagged_regions_squares_them_and_stays_inside_the_frame():
    x0, y0, x1, y1 = evidence.crop_box([_region(0.40, 0.50, 0.10, 0.05)], W, H)
    assert x1 - x0 == y1 - y0 == round(0.10 * W * 2)  # the longer side, half again on each side
    assert (x0 + x1) / 2 == pytest.approx(0.45 * W, abs=1) and (y0 + y1) / 2 == pytest.approx(0.525 * H, abs=1)
    # Two regions: their union; at the corner: moved inside, never cut short.
    assert evidence.crop_box([_region(0.9, 0.9, 0.1, 0.1), _region(0.8, 0.85, 0.05, 0.05)], W, H)[2:] == (W, H)
    # A tiny region still gets context; a region as big as the frame gets the whole shorter side.
    x0, _, x1, _ = evidence.crop_box([_region(0.5, 0.5, 0.001, 0.001)], W, H)
    assert x1 - x0 == round(evidence.MIN_SIDE * H)
    assert evidence.crop_box([_region(0, 0, 1, 1)], W, H) == (300, 0, 2100, 1800)
    assert evidence.crop_box([], W, H) is None


def test_the_crop_is_cut_at_full_resolution_around_the_flagged_region():
    frame = np.full((H, W, 3), 90, np.uint8)
    frame[900:930, 960:1000] = (0, 0, 255)  # a 40 x 30 px red mark: under 7 px once the frame is squashed to 384
    cut = evidence.crop(_png(frame), [_region(960 / W, 900 / H, 40 / W, 30 / H)])
    assert cut is not None
    jpeg, box = cut
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert jpeg[:2] == b"\xff\xd8" and image.shape[:2] == (round(box.height * H), round(box.width * W)) == (225, 225)
    red = (image[..., 2] > 200) & (image[..., 1] < 60)
    ys, xs = np.nonzero(red)
    assert 28 <= ys.max() - ys.min() + 1 <= 32 and 38 <= xs.max() - xs.min() + 1 <= 42  # full-resolution pixels
    assert box.x < 960 / W and box.x + box.width > 1000 / W and box.y < 900 / H and box.y + box.height > 930 / H


def test_the_reference_is_the_nearest_good_frame_kept():
    rng = np.random.default_rng(0)
    flagged = rng.integers(0, 255, (120, 160, 3), dtype=np.uint8)
    near = np.clip(flagged.astype(int) + 8, 0, 255).astype(np.uint8)
    far = rng.integers(0, 255, (120, 160, 3), dtype=np.uint8)
    assert evidence.nearest(_png(flagged), [_png(far), _png(near), _png(far)]) == 1
    assert evidence.nearest(_png(flagged), [b"GIF89a not a frame OpenCV reads", _png(near)]) == 1


def test_only_frames_the_gate_passed_under_this_bank_and_no_person_overruled_are_good():
    def report(verdict=inspection_pb2.VERDICT_OK, by=inspection_pb2.DECIDED_BY_GATE, bank="p@v2:aa", review=0):
        r = inspection_pb2.DefectReport(verdict=verdict, anomaly=inspection_pb2.AnomalyFinding(decided_by=by))
        r.anomaly.bank_id = bank
        r.review.verdict = review
        return r

    assert evidence.is_good(report(), "p@v2:aa")
    assert evidence.is_good(report(review=inspection_pb2.VERDICT_OK), "p@v2:aa")
    assert not evidence.is_good(report(bank="p@v1:bb"), "p@v2:aa")  # another version's good set
    assert not evidence.is_good(report(by=inspection_pb2.DECIDED_BY_VLM), "p@v2:aa")
    assert not evidence.is_good(report(review=inspection_pb2.VERDICT_DEFECT), "p@v2:aa")


def test_captions_number_the_images_in_the_prompts_order():
    roles = [inspection_pb2.PromptImage(role=r) for r in ("frame", "crop", "reference")]
    assert evidence.Evidence([], roles).captions == (
        "Image 1: the whole part.", "Image 2: the flagged region, enlarged.", "Image 3: a good part for reference."
    )  # fmt: skip
    assert evidence.Evidence([], [roles[0], roles[2]]).captions[1] == "Image 2: a good part for reference."


def test_a_three_image_prompt_is_the_processors_and_keeps_the_one_image_prefix(tiny_checkpoint, part_images):
    processor = load_processor(open_checkpoint(tiny_checkpoint))
    roles = ("frame", "crop", "reference")
    captions = evidence.Evidence([], [inspection_pb2.PromptImage(role=r) for r in roles]).captions
    text = prompt_text(processor, build_messages("Look there.", "[SPEC-1 / 2] scratches", captions=captions))
    images = part_images[:3]
    want = processor(text=text, images=images, return_tensors="pt")
    ids = prompt_ids(processor, text)
    assert ids == want["input_ids"][0].tolist() and want["pixel_values"].shape[0] == 3
    slot = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    assert ids.count(slot) == 3 * processor.num_image_tokens
    one = prompt_ids(processor, prompt_text(processor, build_messages("Look there.", "[SPEC-1 / 2] scratches")))
    assert ids[: ids.index(slot)] == one[: one.index(slot)]  # the stages' cached prefix is shared
    assert build_messages("x")[1]["content"] == [{"type": "image"}, {"type": "text", "text": "x"}]  # unchanged


@pytest.mark.parametrize("wire", [codec.Codec.fp32, codec.Codec.fp16, codec.Codec.int8])
def test_visual_tokens_join_in_the_prompts_order_exactly(wire):
    parts = [torch.randn(16, 32) + k for k in range(3)]  # [T, C] per image
    frames = [codec.encode_frame(p, wire) for p in parts]
    joined = codec.join_rows(frames, name="visual tokens")
    want = torch.cat([codec.decode_frame(f).float() for f in frames])  # what each image's frame holds, not requantized
    assert torch.equal(codec.decode_frame(joined).float(), want)


def test_a_frame_opencv_cannot_read_gets_no_crop_rather_than_a_failed_explanation():
    assert evidence.crop(b"II*\x00 a TIFF OpenCV's build may not read", [_region(0.2, 0.2, 0.1, 0.1)]) is None
