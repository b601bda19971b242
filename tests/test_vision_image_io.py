"""decode_image: untrusted bytes in, an RGB image or an InvalidInput naming what was wrong."""

from __future__ import annotations

import io

import pytest
from PIL import Image, ImageFile
from vision_images import jpeg, png_bomb

from edgeinspect.errors import FailedPrecondition, InvalidInput
from edgeinspect.models.image_io import decode_image

MB = 1 << 20


def test_a_good_jpeg_decodes_to_rgb_of_its_size():
    image = decode_image(jpeg(320, 240), 20 * MB, 40_000_000)
    assert image.mode == "RGB" and image.size == (320, 240)


def test_paletted_and_alpha_images_come_back_rgb():
    for mode in ("P", "RGBA", "L", "1"):
        buf = io.BytesIO()
        Image.new(mode, (30, 20)).save(buf, "PNG")
        assert decode_image(buf.getvalue(), MB, 10_000).mode == "RGB"


def test_empty_bytes_are_refused():
    with pytest.raises(InvalidInput, match="empty image"):
        decode_image(b"", MB, 1000)


def test_bytes_over_the_limit_are_refused_naming_both_sizes():
    data = jpeg()
    with pytest.raises(InvalidInput) as info:
        decode_image(data, 1000, 40_000_000)
    assert f"{len(data)} bytes" in str(info.value) and "limit of 1000 bytes" in str(info.value)


def test_a_20000x20000_png_is_refused_from_its_header_before_allocation(monkeypatch):
    data = png_bomb(20000, 20000)
    assert len(data) < 200_000  # 400 M pixels in a few tens of kB: the bomb
    loads = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loads.append(self.size) or real_load(self))
    with pytest.raises(InvalidInput) as info:
        decode_image(data, 20 * MB, 40_000_000)
    assert "400000000 pixels" in str(info.value) and "limit of 40000000 pixels" in str(info.value)
    assert loads == []  # no pixel buffer was ever asked for


def test_an_image_within_the_limits_is_loaded(monkeypatch):
    loads = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loads.append(self.size) or real_load(self))
    decode_image(png_bomb(64, 48), MB, 10_000)
    assert loads and set(loads) == {(64, 48)}


def test_an_image_under_pillows_own_limit_but_over_ours_is_refused():
    data = png_bomb(3000, 3000)  # 9 M pixels: Pillow would decode it happily
    with pytest.raises(InvalidInput, match=r"3000x3000 = 9000000 pixels, over this node's limit of 1000000"):
        decode_image(data, 20 * MB, 1_000_000)


def test_a_truncated_jpeg_is_refused():
    data = jpeg()
    for cut in (len(data) // 2, len(data) - 2, 200):
        with pytest.raises(InvalidInput, match="truncated or corrupt image"):
            decode_image(data[:cut], 20 * MB, 40_000_000)


def test_non_image_bytes_are_refused():
    with pytest.raises(InvalidInput, match="not an image"):
        decode_image(b"%PDF-1.7 this is a spec sheet, not a photo" * 10, 20 * MB, 40_000_000)


def test_decoding_refuses_to_run_with_pillows_truncated_images_switch_on(monkeypatch):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(FailedPrecondition, match="LOAD_TRUNCATED_IMAGES"):
        decode_image(jpeg(), 20 * MB, 40_000_000)
