"""Images for the vision tests: a decompression bomb built without ever holding its pixels, JPEGs, varied PNGs."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image


def png_bomb(width: int, height: int) -> bytes:
    """A valid all-black 1-bit PNG of width x height, compressed row by row (20000x20000 is ~50 kB)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    row = bytes(1 + (width + 7) // 8)  # filter byte 0 + packed bits
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # bit depth 1, greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def jpeg(width: int = 320, height: int = 240) -> bytes:
    buf = io.BytesIO()
    Image.radial_gradient("L").resize((width, height)).convert("RGB").save(buf, "JPEG", quality=90)
    return buf.getvalue()


def varied_png(width: int, height: int, seed: int) -> bytes:
    """Gradients plus noise, so preprocessing and the tower see real variation."""
    rng = np.random.default_rng(seed)
    x, y = np.meshgrid(np.linspace(0, 1, width), np.linspace(0, 1, height))
    base = np.stack([x, y, (x * y) ** 0.5], -1) * 200 + rng.normal(0, 25, (height, width, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB").save(buf, "PNG")
    return buf.getvalue()
