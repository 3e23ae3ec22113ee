"""Every kind of file a real collection or an attacker can put in an image folder, and
what mule does with it: read it (any mode or format Pillow knows), or reject it with a
reason, never crash, never hang, never decode a bomb. The same table runs through the
header probe (ingest), the decoder (features, search, figures) and the features stage's
crop pipeline."""

from __future__ import annotations

import io
import os
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from mule.datasets.image_files import MAX_PIXELS, BadImage, load_rgb, probe
from mule.datasets.readers.base import image_record
from mule.mule_core.backbones import crop_transform


def png_claiming_size(width: int, height: int) -> bytes:
    """A valid 1x1 PNG whose header then claims width x height (the CRC fixed up): a bomb
    of a few bytes."""
    buffer = io.BytesIO()
    Image.new("L", (1, 1)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr : ihdr + 17])))
    return bytes(data)


def _jpeg_with_size(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, "JPEG")
    data = bytearray(buffer.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _save(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    return _save(Image.new("RGB", (40, 20), "blue"), "JPEG", exif=exif)


def _animated() -> bytes:
    frames = [Image.new("P", (16, 16), i) for i in (1, 2)]
    return _save(frames[0], "GIF", save_all=True, append_images=frames[1:])


def _text_bomb() -> bytes:
    info = PngImagePlugin.PngInfo()
    info.add_text("comment", "A" * (8 << 20), zip=True)  # 8 MB of text that compresses to kilobytes
    return _save(Image.new("RGB", (4, 4)), "PNG", pnginfo=info)


def _corrupt_png() -> bytes:
    data = bytearray(_save(Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), np.uint8)), "PNG"))
    idat = data.index(b"IDAT")
    data[idat + 20 : idat + 40] = bytes(20)  # compressed pixels overwritten
    return bytes(data)


def _rgb(size=(32, 24)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(1).integers(0, 255, (size[1], size[0], 3), np.uint8))


def _can_save(fmt: str) -> bool:
    try:
        _save(_rgb((4, 4)), fmt)
        return True
    except (OSError, KeyError):
        return False


# name -> (bytes, expected): ("ok", (width, height) after EXIF orientation) or ("reject", reason fragment)
KINDS = {
    "rgb.jpg": (_save(_rgb(), "JPEG"), ("ok", (32, 24))),
    "grey.png": (_save(_rgb().convert("L"), "PNG"), ("ok", (32, 24))),
    "alpha.png": (_save(_rgb().convert("RGBA"), "PNG"), ("ok", (32, 24))),
    "palette-transparent.gif": (_save(Image.new("P", (10, 10), 3), "GIF", transparency=3), ("ok", (10, 10))),
    "animated.gif": (_animated(), ("ok", (16, 16))),
    "cmyk.jpg": (_save(_rgb().convert("CMYK"), "JPEG"), ("ok", (32, 24))),
    "grey16.png": (
        _save(Image.fromarray(np.arange(600, dtype=np.uint16).reshape(20, 30) * 100), "PNG"),
        ("ok", (30, 20)),
    ),
    "float.tif": (
        _save(Image.fromarray(np.linspace(-1, 1, 600, dtype=np.float32).reshape(20, 30)), "TIFF"),
        ("ok", (30, 20)),
    ),
    "bilevel.png": (_save(_rgb().convert("1"), "PNG"), ("ok", (32, 24))),
    "photo.webp": (_save(_rgb(), "WEBP"), ("ok", (32, 24))),
    "rotated-by-exif.jpg": (_exif_rotated(), ("ok", (20, 40))),
    "one-pixel.png": (_save(Image.new("RGB", (1, 1), "white"), "PNG"), ("ok", (1, 1))),
    "panorama-50-to-1.png": (_save(Image.new("RGB", (1000, 20)), "PNG"), ("ok", (1000, 20))),
    "strip-200-to-1.png": (_save(Image.new("RGB", (2000, 10)), "PNG"), ("reject", "aspect ratio beyond 50:1")),
    "over-the-limit.png": (png_claiming_size(10_000, 10_000), ("reject", f"more than {MAX_PIXELS:,}")),
    "png-bomb.png": (png_claiming_size(100_000, 100_000), ("reject", "decompression bomb")),
    "jpeg-bomb.jpg": (_jpeg_with_size(60_000, 60_000), ("reject", "decompression bomb")),
    "text-chunk-bomb.png": (_text_bomb(), ("reject", "Decompressed")),
    "truncated.jpg": (_save(_rgb((200, 200)), "JPEG")[:6000], ("reject", "does not decode")),
    "truncated-header.jpg": (_save(_rgb((200, 200)), "JPEG")[:300], ("reject", "unreadable image header")),
    "corrupt.png": (_corrupt_png(), ("reject", "does not decode")),
    "empty.jpg": (b"", ("reject", "empty file (0 bytes)")),
    "text.jpg": (b"<html>not an image</html>\n", ("reject", "not a JPEG, PNG, WebP, GIF, BMP or TIFF image")),
    "svg.jpg": (b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>', ("reject", "not a JPEG, PNG")),
    # formats Pillow reads but photos never come in: EPS (rendered by Ghostscript where it is installed), ICO
    "eps.jpg": (_save(_rgb(), "EPS") if _can_save("EPS") else b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 32 24\n",
                ("reject", "not a JPEG, PNG, WebP, GIF, BMP or TIFF image")),
    "icon.jpg": (_save(_rgb((16, 16)), "ICO"), ("reject", "not a JPEG, PNG, WebP, GIF, BMP or TIFF image")),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images")
    for name, (data, _) in KINDS.items():
        (root / name).write_bytes(data)
    return root


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_kind_of_file_is_read_or_rejected_with_its_reason(folder, name):
    path = folder / name
    outcome, detail = KINDS[name][1]
    transform = crop_transform(224, 0, 1)
    exists, sha, width, height = image_record(path, True)  # ingest: header only
    assert exists and len(sha) == 64
    if outcome == "ok":
        image = load_rgb(path, min_side=transform.shorter_side)
        assert image.mode == "RGB" and image.size == detail
        assert transform(image).shape == (1, 3, 224, 224)
        assert (width, height) in (detail, detail[::-1])  # the header's size (before EXIF orientation)
    else:
        with pytest.raises(BadImage, match=detail.replace("(", r"\(").replace(")", r"\)")):
            load_rgb(path, min_side=transform.shorter_side)
        if "bomb" in name or "limit" in name or "aspect" in detail:
            assert (width, height) == (None, None) and pytest.raises(BadImage, probe, path)


def test_things_that_are_not_regular_files_are_never_opened(tmp_path):
    os.mkfifo(tmp_path / "pipe.jpg")  # opening it would block forever
    (tmp_path / "folder.jpg").mkdir()
    (tmp_path / "zeros.jpg").symlink_to("/dev/zero")  # reading it would never end
    for name in ("pipe.jpg", "folder.jpg", "zeros.jpg"):
        assert image_record(tmp_path / name, True) == (False, None, None, None)
        with pytest.raises(BadImage, match="not a regular file"):
            load_rgb(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        load_rgb(tmp_path / "gone.jpg")


def test_memory_stays_bounded_on_huge_files_and_bombs(tmp_path):
    big = tmp_path / "huge.jpg"
    with open(big, "wb") as handle:  # 256 MiB of zeros (sparse: no disk used), named like an image
        handle.truncate(256 << 20)
    (tmp_path / "bomb.png").write_bytes(png_claiming_size(100_000, 100_000))
    tracemalloc.start()
    try:
        assert image_record(big, True)[0] is True
        for path in (big, tmp_path / "bomb.png"):
            with pytest.raises(BadImage):
                load_rgb(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak / 2**20:.1f} MiB"


def test_a_large_jpeg_is_decoded_at_a_reduced_scale(tmp_path):
    path = tmp_path / "large.jpg"
    _rgb((4000, 3000)).save(path, "JPEG")
    image = load_rgb(path, min_side=256)
    assert min(image.size) >= 256 and image.size[0] <= 1000  # 1/4 scale: 1000 x 750, not 4000 x 3000


def test_16_bit_and_float_images_come_to_8_bits_in_strips_as_one_stretch():
    """Strip by strip, the same stretch as the whole image's (min to max onto 0..255), and a
    float image's NaN and infinities read as its minimum."""
    from mule.datasets.image_files import _to_8bit

    values = (np.arange(300 * 40, dtype=np.uint16).reshape(300, 40) * 5) + 1000
    eight = np.asarray(_to_8bit(Image.fromarray(values), strip_rows=7))
    expected = ((values.astype(np.float64) - values.min()) * 255 / (values.max() - values.min())).astype(np.uint8)
    assert eight.dtype == np.uint8 and np.abs(eight.astype(int) - expected).max() <= 1
    assert eight.min() == 0 and eight.max() == 255
    floats = np.linspace(-1, 1, 600, dtype=np.float32).reshape(20, 30)
    floats[0, 0], floats[0, 1] = np.nan, np.inf
    out = np.asarray(_to_8bit(Image.fromarray(floats), strip_rows=3))
    assert out[0, 0] == 0 and out[0, 1] == 0 and out.max() == 255


def test_a_query_s_budget_counts_the_bytes_an_image_decodes_to(tmp_path):
    """Within the pixel budget, an RGBA or float image decodes to more bytes than an RGB
    photo of as many pixels: a query's byte budget (3 bytes a pixel) refuses it from its
    header, before anything is decoded; an RGB image of as many pixels passes."""
    from mule.api.from_file import open_query_image
    from mule.mule_core.embedder import EmbedError

    rgba = _save(Image.new("RGBA", (100, 100)), "PNG")
    with pytest.raises(EmbedError, match=r"100x100 pixels of RGBA decode to .* MiB, more than"):
        open_query_image(rgba, 32, 100 * 100)
    with open_query_image(_save(Image.new("RGB", (100, 100)), "PNG"), 32, 100 * 100) as image:
        assert image.size == (100, 100)
    big = _save(Image.new("RGB", (400, 300)), "PNG")  # far larger than a 32-px crop needs: reduced first
    with open_query_image(big, 32, 10**6) as image:
        assert image.size == (400 // 4, 300 // 4)


DECODE = r"""
import io, json, sys
import numpy as np
from PIL import Image
from mule.api.from_file import open_query_image


def made(kind, side):
    ramp = (np.arange(side * side, dtype=np.uint32) % 65521).reshape(side, side)
    if kind == "16-bit grey PNG":
        image, form, options = Image.fromarray(ramp.astype(np.uint16)), "PNG", {}
    elif kind == "RGBA PNG":
        image, form, options = Image.fromarray(np.dstack([ramp % 256] * 4).astype(np.uint8)), "PNG", {}
    elif kind == "RGB BMP":
        image, form, options = Image.fromarray(np.dstack([ramp % 256] * 3).astype(np.uint8)), "BMP", {}
    else:  # a camera's JPEG, turned by its EXIF orientation
        exif = Image.Exif()
        exif[0x0112] = 6
        image, form, options = (Image.fromarray(np.dstack([ramp % 256] * 3).astype(np.uint8)), "JPEG",
                                {"exif": exif.tobytes()})
    buffer = io.BytesIO()
    image.save(buffer, form, **options)
    return buffer.getvalue()


def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) * 1024


out = {}
for kind, side in json.loads(sys.argv[1]):
    data = made(kind, side)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident size counts from here
    before = status("VmRSS")
    with open_query_image(data, 256, 40_000_000) as decoded:
        size = decoded.size
    out[kind] = {"growth": status("VmHWM") - before, "size": size}
    del data, decoded
print(json.dumps(out))
"""
CASES = [("16-bit grey PNG", 6000, 2), ("RGBA PNG", 4800, 4), ("RGB BMP", 4000, 4), ("rotated JPEG", 6000, 4)]


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="peak memory is read from Linux's /proc")
@pytest.mark.slow
def test_decoding_an_upload_costs_about_what_pillow_stores_it_in_not_copies_of_it():
    """A query image's peak memory while it is decoded (for a 256-px crop, as `mule serve`
    does): the decoded image in Pillow's own storage (4 bytes a pixel for RGB and RGBA, 2
    for 16-bit grey), a strip at a time beside it, never a second copy. The 16-bit path
    held the image as an array too (4x its size in all), exif_transpose copied every
    image, and reducing an RGBA image copied it premultiplied (3x). bench/decode_memory.py
    prints the same for larger images. Each case in one fresh process, its peak reset
    before it."""
    import json
    import subprocess
    import sys

    cases = json.dumps([(kind, side) for kind, side, _ in CASES])
    done = subprocess.run([sys.executable, "-c", DECODE, cases], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    for kind, side, stored in CASES:
        budget = side * side * stored * 1.15 + 48 * 2**20  # its storage, and the decoder's buffers and strips
        grown = figures[kind]["growth"]
        assert grown < budget, f"{kind}: {grown / 2**20:.0f} MB for {side * side * stored / 2**20:.0f} MB"
        assert min(figures[kind]["size"]) >= 256
