"""Opening image files that anyone could have put in an image folder.

Real collections and attackers put every kind of file there: formats and modes Pillow
reads (palette, 16-bit, CMYK, alpha, animations), files it refuses for its own safety
(decompression bombs: a few kilobytes that claim billions of pixels), truncated or
corrupt data, files that are not images at all, absurd shapes (10,000 x 1). Every
caller asks here, and gets either an RGB image or a `BadImage` with a reason a person
can read; nothing else escapes, and memory stays bounded:

- the pixel count is checked from the header, before any decoding, against
  MAX_PIXELS (Pillow's own limit, enforced whatever a caller did to Pillow's setting);
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


class BadImage(ValueError):
    """A file that is not an image mule can use; `reason` says why, for a rejects row."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class TooManyPixels(BadImage):
    """More pixels than the caller's budget, known from the header: nothing was decoded."""


def _check_size(width: int, height: int, max_pixels: int = MAX_PIXELS) -> None:
    if width < 1 or height < 1:
        raise BadImage(f"image of {width}x{height} pixels")
    if width * height > min(max_pixels, MAX_PIXELS):
        limit = min(max_pixels, MAX_PIXELS)
        bomb = " (a decompression bomb?)" if width * height > MAX_PIXELS else ""
        raise TooManyPixels(f"{width}x{height} pixels is more than {limit:,}{bomb}: not decoded")
    if max(width, height) > MAX_ASPECT * min(width, height):
        raise BadImage(f"{width}x{height} pixels: an aspect ratio beyond {MAX_ASPECT}:1")


def _open(path: Path | bytes, max_pixels: int = MAX_PIXELS) -> Image.Image:
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
            image = Image.open(source)
    except FileNotFoundError:
        raise
    except Image.DecompressionBombError as error:
        raise BadImage(f"refused by Pillow as a decompression bomb: {error}") from None
    except UnidentifiedImageError:
        empty = not isinstance(path, bytes) and Path(path).stat().st_size == 0
        raise BadImage("empty file (0 bytes)" if empty else "not an image format Pillow can read") from None
    except (OSError, ValueError, SyntaxError, EOFError) as error:
        raise BadImage(f"unreadable image header: {error}") from None
    except (TypeError, IndexError, KeyError) as error:
        if not _raised_by_pillow(error):
            raise  # a bug of ours, not a bad file
        raise BadImage(f"unreadable image header: {error!r}") from None
    try:
        _check_size(*image.size, max_pixels)
    except BadImage:
        image.close()
        raise
    return image


def probe(path: Path) -> tuple[int, int]:
    """(width, height) from the file's header, without decoding it; BadImage if unusable."""
    with _open(path) as image:
        return image.size


def load_rgb(path: Path | bytes, min_side: int = 0, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """The decoded image (a file, or its bytes) in RGB (EXIF orientation applied; first frame of an animation).

    min_side: the smallest shorter side the caller needs; a JPEG much larger than that is
    decoded at 1/2, 1/4 or 1/8 scale (never below min_side), which bounds memory and time.
    max_pixels: a budget below Pillow's limit (an upload's), checked from the header.
    Raises FileNotFoundError for a missing file and BadImage for anything unusable
    (TooManyPixels past the budget).
    """
    with _open(path, max_pixels) as image:
        try:
            if min_side and image.format == "JPEG":
                width, height = image.size
                scale = min_side / min(width, height)
                image.draft("RGB", (max(1, round(width * scale)), max(1, round(height * scale))))
            image.load()  # decode now: a truncated file fails here, not later
            image = ImageOps.exif_transpose(image) or image
            if image.mode in ("P", "PA") and "transparency" in image.info:
                image = image.convert("RGBA")
            if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # 16/32-bit grey: scale to 8 bits first
                image = _to_8bit(image)
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


def _to_8bit(image: Image.Image) -> Image.Image:
    import numpy as np

    values = np.asarray(image, dtype=np.float64)
    low, high = float(np.nanmin(values)), float(np.nanmax(values))
    scaled = np.zeros_like(values) if high <= low else (values - low) * (255.0 / (high - low))
    return Image.fromarray(np.nan_to_num(scaled).clip(0, 255).astype(np.uint8), "L")
