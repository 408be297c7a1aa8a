"""Checking images by their headers: present, readable, real size, colour mode.

PIL reads only the header on open, so this costs one small read per image and no
decoding. The tf.data pipeline decodes with ``channels=3``, which turns grayscale into
RGB and drops alpha; the modes are counted so that the summary can say so.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from detsweep.errors import DetsweepError

# What tf.io.decode_image reads; anything else (TIFF, …) would fail inside tf.data.
DECODABLE_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP")
GRAYSCALE_MODES = {"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "F"}
ALPHA_MODES = {"RGBA", "RGBa", "PA"}


@dataclass(frozen=True)
class ImageHeader:
    width: int
    height: int
    mode: str
    format: str

    @property
    def kind(self) -> str | None:
        """The count this image adds to: grayscale_images, rgba_images, cmyk_images, or None."""
        if self.mode in GRAYSCALE_MODES:
            return "grayscale_images"
        if self.mode in ALPHA_MODES:
            return "rgba_images"
        if self.mode == "CMYK":
            return "cmyk_images"
        return None


def read_header(path: str | None, encoded: bytes | None, name: str, referenced_by: str | None = None) -> ImageHeader:
    """The header of an image file (``path``) or of encoded bytes; ``name`` is used in messages."""
    by = f" (referenced by {referenced_by})" if referenced_by else ""
    try:
        with Image.open(io.BytesIO(encoded) if encoded is not None else path) as image:
            header = ImageHeader(image.width, image.height, _mode(image), image.format or "unknown")
    except FileNotFoundError:
        raise DetsweepError(f"{name}: image file not found{by}") from None
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as error:
        reason = "not a JPEG, PNG, GIF, BMP or WebP image" if isinstance(error, UnidentifiedImageError) else error
        raise DetsweepError(f"{name}: cannot read the image: {reason}{by}") from None
    if header.format not in DECODABLE_FORMATS:
        raise DetsweepError(f"{name}: found a {header.format} image, expected one of {', '.join(DECODABLE_FORMATS)}{by}")
    return header


def _mode(image: Image.Image) -> str:
    # A palette of grays only is a grayscale image that happens to be stored as "P".
    if image.mode == "P" and image.palette is not None:
        raw = bytes(image.palette.palette)
        if image.palette.mode == "RGB" and raw[0::3] == raw[1::3] == raw[2::3]:
            return "L"
    return image.mode
