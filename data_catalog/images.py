"""Opening image files that anyone could have put in an image folder.

Real collections and attackers put every kind of file there: formats and modes Pillow
reads (palette, 16-bit, CMYK, alpha, animations), files it refuses for its own safety
(decompression bombs: a few kilobytes that claim billions of pixels), truncated or
corrupt data, files that are not images at all, absurd shapes (10,000 x 1). Every
caller asks here, and gets either an RGB image or a `BadImage` with a reason a person
can read; nothing else escapes, and memory stays bounded:

- only the formats photos come in are opened (FORMATS: JPEG, PNG, WebP, GIF, BMP, TIFF):
  Pillow reads many more, EPS among them, which it renders through Ghostscript where that
  is installed;
- the pixel count is checked from the header, before any decoding, against
  MAX_PIXELS (Pillow's own limit, enforced whatever a caller did to Pillow's setting),
  and so are the bytes the first frame decodes to (16-bit, 32-bit and float images take
  two to four times an 8-bit one's: MAX_DECODED_BYTES, or a caller's smaller budget);
  16-bit, 32-bit and float images are brought to 8 bits in strips, never as one float64
  array, and an image far larger than the caller needs is reduced before it is converted;
- the aspect ratio is capped (MAX_ASPECT): resizing the shorter side of a 10,000 x 1
  image to 256 pixels would allocate gigabytes;
- JPEGs are decoded at a reduced scale (DCT scaling) when far larger than needed.
"""

from __future__ import annotations

import io
import os
import stat
import warnings
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError

# Pillow's default (about 89.5 million pixels, a 0.25 GB RGB image); larger images are
# refused here even if Image.MAX_IMAGE_PIXELS was raised or switched off elsewhere.
MAX_PIXELS = 89_478_485
MAX_ASPECT = 50  # longer side / shorter side; panoramas are about 10
# What photos come in; Pillow's other formats (EPS, PDF, PSD, ICO, ...) are not opened at all.
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
FORMAT_NAMES = "JPEG, PNG, WebP, GIF, BMP or TIFF"
# Bytes a pixel decodes to, per Pillow mode (the first frame: only it is decoded)
_PIXEL_BYTES = {"1": 1, "L": 1, "P": 1, "LA": 2, "La": 2, "PA": 2, "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3,
                "RGBA": 4, "RGBa": 4, "RGBX": 4, "CMYK": 4, "I": 4, "F": 4, "I;16": 2, "I;16B": 2, "I;16L": 2,
                "I;16N": 2}  # fmt: skip
MAX_DECODED_BYTES = 4 * MAX_PIXELS  # an RGBA image at Pillow's pixel limit


class BadImage(ValueError):
    """A file that is not an image mule can use; `reason` says why, for a rejects row."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class TooManyPixels(BadImage):
    """More pixels than the caller's budget, known from the header: nothing was decoded."""


def decoded_bytes(image: Image.Image) -> int:
    """What the first frame decodes to, from its header (4 bytes a pixel for a mode not listed)."""
    width, height = image.size
    return width * height * _PIXEL_BYTES.get(image.mode, 4)


def _check_size(width: int, height: int, max_pixels: int = MAX_PIXELS) -> None:
    if width < 1 or height < 1:
        raise BadImage(f"image of {width}x{height} pixels")
    if width * height > min(max_pixels, MAX_PIXELS):
        limit = min(max_pixels, MAX_PIXELS)
        bomb = " (a decompression bomb?)" if width * height > MAX_PIXELS else ""
        raise TooManyPixels(f"{width}x{height} pixels is more than {limit:,}{bomb}: not decoded")
    if max(width, height) > MAX_ASPECT * min(width, height):
        raise BadImage(f"{width}x{height} pixels: an aspect ratio beyond {MAX_ASPECT}:1")


def _open(path: Path | bytes, max_pixels: int = MAX_PIXELS, max_bytes: int = MAX_DECODED_BYTES) -> Image.Image:
    """`path`: a file, or an image's bytes (an upload)."""
    if isinstance(path, bytes):
        if not path:
            raise BadImage("empty file (0 bytes)")
        source = io.BytesIO(path)
    # Only regular files: opening a FIFO named like an image would block forever, a device
    # (a link to /dev/zero or /dev/urandom) would never end.
    elif not stat.S_ISREG(os.stat(path).st_mode):  # FileNotFoundError for a missing file
        raise BadImage("not a regular file (a folder, a pipe or a device)")
    else:
        source = path
    try:
        with warnings.catch_warnings():
            # Sizes are checked here; Pillow's warning for images between its limit and twice it is noise.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(source, formats=FORMATS)
    except FileNotFoundError:
        raise
    except Image.DecompressionBombError as error:
        raise BadImage(f"refused by Pillow as a decompression bomb: {error}") from None
    except UnidentifiedImageError:
        empty = not isinstance(path, bytes) and Path(path).stat().st_size == 0
        raise BadImage("empty file (0 bytes)" if empty else f"not a {FORMAT_NAMES} image") from None
    except (OSError, ValueError, SyntaxError, EOFError) as error:
        raise BadImage(f"unreadable image header: {error}") from None
    except (TypeError, IndexError, KeyError) as error:
        if not _raised_by_pillow(error):
            raise  # a bug of ours, not a bad file
        raise BadImage(f"unreadable image header: {error!r}") from None
    try:
        _check_size(*image.size, max_pixels)
        if decoded_bytes(image) > min(max_bytes, MAX_DECODED_BYTES):
            raise TooManyPixels(f"{image.size[0]}x{image.size[1]} pixels of {image.mode} decode to "
                                f"{decoded_bytes(image) / 2**20:,.0f} MiB, more than "
                                f"{min(max_bytes, MAX_DECODED_BYTES) / 2**20:,.0f} MiB: not decoded")  # fmt: skip
    except BadImage:
        image.close()
        raise
    return image


def probe(path: Path) -> tuple[int, int]:
    """(width, height) from the file's header, without decoding it; BadImage if unusable."""
    with _open(path) as image:
        return image.size


def load_rgb(path: Path | bytes, min_side: int = 0, max_pixels: int = MAX_PIXELS,
             max_bytes: int = MAX_DECODED_BYTES) -> Image.Image:  # fmt: skip
    """The decoded image (a file, or its bytes) in RGB (EXIF orientation applied; first frame of an animation).

    min_side: the smallest shorter side the caller needs; a JPEG much larger than that is
    decoded at 1/2, 1/4 or 1/8 scale (never below min_side), which bounds memory and time.
    max_pixels, max_bytes: budgets below Pillow's limit (an upload's), checked from the
    header: pixels, and the bytes the first frame decodes to. Raises FileNotFoundError for
    a missing file and BadImage for anything unusable (TooManyPixels past a budget).
    """
    with _open(path, max_pixels, max_bytes) as image:
        try:
            if min_side and image.format == "JPEG":
                width, height = image.size
                scale = min_side / min(width, height)
                image.draft("RGB", (max(1, round(width * scale)), max(1, round(height * scale))))
            image.load()  # decode now: a truncated file fails here, not later
            image = ImageOps.exif_transpose(image) or image
            if image.mode in ("P", "PA") and "transparency" in image.info:
                image = image.convert("RGBA")
            if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):  # 16/32-bit grey: to 8 bits first
                image = _to_8bit(image)
            factor = min(image.size) // (2 * min_side) if min_side else 0
            if factor >= 2 and image.mode in ("L", "RGB", "RGBA", "LA", "P", "CMYK"):
                # far larger than needed (a JPEG's draft already came down): reduce before the RGB copy
                image = (image.convert("RGB") if image.mode in ("P", "CMYK") else image).reduce(factor)
            return image.convert("RGB")
        except MemoryError:
            raise BadImage("not enough memory to decode it") from None
        except (OSError, ValueError, SyntaxError, EOFError) as error:  # what Pillow raises for bad bytes
            raise BadImage(f"image does not decode: {error}") from None
        except (TypeError, IndexError, KeyError, ZeroDivisionError) as error:
            # Pillow's parsers also fail this way on malformed files (EXIF, palettes);
            # raised by our own code, they are bugs and keep their traceback.
            if not _raised_by_pillow(error):
                raise
            raise BadImage(f"image does not decode: {error!r}") from None


def _raised_by_pillow(error: BaseException) -> bool:
    """The exception was raised inside Pillow's own modules (its innermost frame is PIL's)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}PIL{os.sep}" in tb.tb_frame.f_code.co_filename


def _to_8bit(image: Image.Image, strip_rows: int = 256) -> Image.Image:
    """A 16-bit, 32-bit or float grey image stretched to 8 bits, a strip of rows at a time:
    never more than the image itself plus a strip (a float64 copy of a 40 MP image was 320 MB)."""
    import numpy as np

    values = np.asarray(image)  # its own type: 2 or 4 bytes a pixel
    finite = values if values.dtype.kind != "f" else np.where(np.isfinite(values), values, np.nan)
    low, high = float(np.nanmin(finite)), float(np.nanmax(finite))
    out = np.zeros(values.shape, np.uint8)
    if high > low:
        scale = 255.0 / (high - low)
        for start in range(0, values.shape[0], strip_rows):
            strip = np.nan_to_num(values[start : start + strip_rows].astype(np.float32), nan=low, posinf=low, neginf=low)
            out[start : start + strip_rows] = ((strip - low) * scale).clip(0, 255).astype(np.uint8)
    return Image.fromarray(out, "L")
