"""Untrusted image bytes -> an RGB PIL image, with explicit limits checked before any pixel is allocated."""

from __future__ import annotations

import io
import re
import warnings

from PIL import Image, ImageFile, UnidentifiedImageError

from edgeinspect.errors import FailedPrecondition, InvalidInput

# Formats a camera or an operator sends; everything else (EPS, PSD, ...) is refused unparsed.
ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "TIFF", "GIF")
# The default limits on one image (the vision node's settings, and the frames `anomaly teach` reads): a 20 MB
# encoded file, 40 MP decoded (a 5 MP station camera with room to spare; an image past it is refused unread).
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGE_PIXELS = 40_000_000
_PIL_PIXELS = re.compile(r"\((\d+) pixels\)")


def decode_image(data: bytes, max_bytes: int, max_pixels: int) -> Image.Image:
    """Decodes an encoded image file; every refusal is InvalidInput with a message naming what was wrong."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        # A process-wide Pillow switch someone turned on; we would silently accept half-decoded frames.
        raise FailedPrecondition(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is on in this process: truncated images would be accepted; turn it off"
        )
    if not data:
        raise InvalidInput("empty image: the request carried no image bytes")
    if len(data) > max_bytes:
        raise InvalidInput(f"image is {len(data)} bytes, over this node's limit of {max_bytes} bytes")
    try:
        # Image.open only parses the header: size is known, no pixel buffer exists yet. Pillow's bomb *warning*
        # (between its two limits) is ours to give: max_pixels below refuses in words, so it would only add noise.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    except Image.DecompressionBombError as exc:
        # Pillow's own (global) guard fired first, at twice its MAX_IMAGE_PIXELS.
        match = _PIL_PIXELS.search(str(exc))
        pixels = match.group(1) if match else "too many"
        raise InvalidInput(f"image has {pixels} pixels, over this node's limit of {max_pixels} pixels") from exc
    except UnidentifiedImageError as exc:
        raise InvalidInput(
            f"not an image: the bytes are none of {', '.join(ALLOWED_FORMATS)} (first bytes {data[:8]!r})"
        ) from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise InvalidInput(f"truncated or corrupt image header: {exc}") from exc

    width, height = image.size
    if width <= 0 or height <= 0:
        raise InvalidInput(f"image has an empty size {width}x{height}")
    if width * height > max_pixels:
        raise InvalidInput(
            f"image is {width}x{height} = {width * height} pixels, over this node's limit of {max_pixels} pixels"
        )
    try:
        image.load()
        return image.convert("RGB")
    except Image.DecompressionBombError as exc:  # a frame of an animated file can be larger than the first
        raise InvalidInput(f"image frame too large: {exc}; this node's limit is {max_pixels} pixels") from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise InvalidInput(f"truncated or corrupt image ({image.format} {width}x{height}): {exc}") from exc
