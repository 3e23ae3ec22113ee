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

# Pillow's default (about 89.5 million pixels, a 0.25 GB RGB image): the budget of every
# caller that names none (ingest, features, mule embed); larger images are refused here even
# if Image.MAX_IMAGE_PIXELS was raised or switched off elsewhere. A caller may raise its
# budget up to CEILING_PIXELS (mule embed --max-pixels): twice Pillow's limit is where
# Pillow refuses an image itself, as a decompression bomb.
MAX_PIXELS = 89_478_485
CEILING_PIXELS = 2 * MAX_PIXELS
MAX_ASPECT = 50  # longer side / shorter side; panoramas are about 10
# What photos come in; Pillow's other formats (EPS, PDF, PSD, ICO, ...) are not opened at all.
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
FORMAT_NAMES = "JPEG, PNG, WebP, GIF, BMP or TIFF"
# Bytes a pixel decodes to, per Pillow mode (the first frame: only it is decoded)
_PIXEL_BYTES = {"1": 1, "L": 1, "P": 1, "LA": 2, "La": 2, "PA": 2, "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3,
                "RGBA": 4, "RGBa": 4, "RGBX": 4, "CMYK": 4, "I": 4, "F": 4, "I;16": 2, "I;16B": 2, "I;16L": 2,
                "I;16N": 2}  # fmt: skip
MAX_DECODED_BYTES = 4 * MAX_PIXELS  # an RGBA image at Pillow's pixel limit
ORIENTATION = 0x0112  # the EXIF tag
STRIP_PIXELS = 1 << 20  # what a strip of a large image holds while it is converted or reduced

# what counts as an image file in a folder of photos (mule embed, a source folder's check)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}


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
    limit = min(max_pixels, CEILING_PIXELS)
    if width * height > limit:
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
        budget = min(max_bytes, 4 * CEILING_PIXELS)
        if decoded_bytes(image) > budget:
            raise TooManyPixels(f"{image.size[0]}x{image.size[1]} pixels of {image.mode} decode to "
                                f"{decoded_bytes(image) / 2**20:,.0f} MiB, more than "
                                f"{budget / 2**20:,.0f} MiB: not decoded")  # fmt: skip
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
    max_pixels, max_bytes: budgets (an upload's is below Pillow's limit; up to
    CEILING_PIXELS and 4 bytes a pixel of it), checked from the header: pixels, and the
    bytes the first frame decodes to. Raises FileNotFoundError for
    a missing file and BadImage for anything unusable (TooManyPixels past a budget).
    """
    with _open(path, max_pixels, max_bytes) as image:
        try:
            if min_side and image.format == "JPEG":
                width, height = image.size
                scale = min_side / min(width, height)
                image.draft("RGB", (max(1, round(width * scale)), max(1, round(height * scale))))
            opened, orientation = image, image.getexif().get(ORIENTATION, 1)  # applied once small
            image.load()  # decode now: a truncated file fails here, not later
            if image.mode in ("P", "PA") and "transparency" in image.info:
                image = image.convert("RGBA")
            factor = min(image.size) // (2 * min_side) if min_side else 0
            if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):  # 16/32-bit grey: to 8 bits first
                image = _to_8bit(image, reduce=max(factor, 1))  # reduced on the way, strip by strip
                factor = 0
            if factor >= 2 and image.mode in ("L", "RGB", "RGBA", "LA", "P", "CMYK"):
                # far larger than needed (a JPEG's draft already came down): reduced before the RGB copy
                image = _reduced(image, factor)
            if orientation != 1:  # on the reduced image: a transposed copy of the full one cost its size again
                image = ImageOps.exif_transpose(image)
            # a new image (the opened one is closed on the way out), made once
            return image if image.mode == "RGB" and image is not opened else image.convert("RGB")
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


def _reduced(image: Image.Image, factor: int) -> Image.Image:
    """The image reduced by `factor` (box averages), a strip of rows at a time: Pillow's own
    reduce copies an RGBA image whole first (premultiplied alpha), and a palette or CMYK
    image had to be made RGB (4 bytes a pixel) whole before it."""
    width, height = image.size
    rows = max(factor, (STRIP_PIXELS // width) // factor * factor)
    out = None
    for top in range(0, height, rows):
        strip = image.crop((0, top, width, min(top + rows, height)))
        strip = (strip.convert("RGB") if strip.mode in ("P", "CMYK") else strip).reduce(factor)
        if out is None:
            out = Image.new(strip.mode, ((width + factor - 1) // factor, (height + factor - 1) // factor))
        out.paste(strip, (0, top // factor))
    return out


def _to_8bit(image: Image.Image, strip_rows: int = 0, reduce: int = 1) -> Image.Image:
    """A 16-bit, 32-bit or float grey image stretched to 8 bits and reduced by `reduce`
    (its pixels averaged in reduce x reduce boxes), a strip of rows at a time: beside the
    decoded image, only a strip and the (reduced) 8-bit result are ever held. A copy of the
    whole image as an array cost its size again (92 MB for a 107 KB 16-bit PNG)."""
    import numpy as np

    width, height = image.size
    rows = max(reduce, (strip_rows or STRIP_PIXELS // width) // reduce * reduce)  # whole boxes in every strip

    def strips():
        for top in range(0, height, rows):
            strip = np.asarray(image.crop((0, top, width, min(top + rows, height)))).astype(np.float32)
            yield top, np.where(np.isfinite(strip), strip, np.nan)

    low = high = None
    for _, strip in strips():  # the range, without a copy of the whole image
        if np.isfinite(strip).any():
            lo, hi = float(np.nanmin(strip)), float(np.nanmax(strip))
            low, high = (lo, hi) if low is None else (min(low, lo), max(high, hi))
    out = np.zeros(((height + reduce - 1) // reduce, (width + reduce - 1) // reduce), np.uint8)
    if low is None or high <= low:
        return Image.fromarray(out, "L")
    scale = 255.0 / (high - low)
    for top, strip in strips():
        scaled = np.nan_to_num((strip - low) * scale, nan=0.0).clip(0, 255)
        if reduce > 1:  # box averages; the last boxes of a side may be partial
            h, w = scaled.shape
            padded = np.pad(scaled, ((0, -h % reduce), (0, -w % reduce)), mode="edge")
            scaled = padded.reshape(padded.shape[0] // reduce, reduce, padded.shape[1] // reduce, reduce).mean((1, 3))
        out[top // reduce : top // reduce + scaled.shape[0]] = scaled.astype(np.uint8)
    return Image.fromarray(out, "L")
