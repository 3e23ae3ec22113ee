"""Every kind of bad input, decided: soft (the line goes to rejects, the read goes on) or
fatal (one error naming the file and line). The README's "Bad input" table is this file.

Fatal errors are UserErrors: the command line prints them as one line and exits 2 (the
last tests run the real command). `strict` turns each soft case into a fatal one.
"""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import pytest

from mule.datasets.readers.multi30k import Multi30kError, ReadOptions, read_multi30k
from mule.mule_core.errors import is_user_error
from tests.conftest import write_gz, write_text

LANGS = ("en", "de", "fr", "cs")
T1 = "data/task1/raw"
T2 = "data/task2/raw"
SPLITS1 = "data/task1/image_splits"
SPLITS2 = "data/task2/image_splits"


def read(root: Path, **options):
    return read_multi30k(root, "tiny", options=ReadOptions(languages=LANGS, **options))


def fatal(root: Path, **options) -> str:
    with pytest.raises(Multi30kError) as error:
        read(root, **options)
    assert is_user_error(error.value)  # -> `mule: error: <message>`, exit code 2, no traceback
    assert str(root) in str(error.value)  # the dataset folder, for the relative file names
    return str(error.value)


def rejects_of(result) -> dict[tuple[str, int | None], dict]:
    return {(r["source_file"], r["line"]): r for r in result.rejects.to_pylist()}


def texts_of(result, split: str | None = None) -> set[str]:
    return {c["text"] for c in result.captions.to_pylist() if split is None or c["split"] == split}


def set_train_images(root: Path, names: list[str], captions: dict[str, list[str]]) -> None:
    """Rewrites the train split: its two split files, and one task1 file per language
    (task2's files removed), line for line."""
    write_text(root / SPLITS1 / "train.txt", names)
    write_text(root / SPLITS2 / "train_images.txt", names)
    for path in (root / T2).glob("train.*"):
        path.unlink()
    for lang, lines in captions.items():
        write_gz(root / T1 / f"train.{lang}.gz", lines)


# -- fatal: the file cannot be trusted --------------------------------------------------


def test_truncated_gzip_is_fatal_and_names_the_file(tiny_multi30k):
    path = tiny_multi30k / T1 / "train.fr.gz"
    path.write_bytes(path.read_bytes()[:-12])  # the stream's end cut off
    assert f"{T1}/train.fr.gz: not a readable gzip file" in fatal(tiny_multi30k)


def test_corrupt_gzip_is_fatal_and_names_the_file(tiny_multi30k):
    (tiny_multi30k / T1 / "train.fr.gz").write_bytes(b"\x1f\x8b\x08\x00garbage, not deflate")
    assert f"{T1}/train.fr.gz: not a readable gzip file" in fatal(tiny_multi30k)


def test_caption_and_split_files_of_different_lengths_are_fatal(tiny_multi30k):
    write_gz(tiny_multi30k / T1 / "train.cs.gz", ["Hnědý pes.", "Dva muži.", "Třetí řádek navíc."])
    message = fatal(tiny_multi30k)
    assert f"{T1}/train.cs.gz has 3 lines but {SPLITS1}/train.txt lists 2 images" in message


def test_an_image_in_two_splits_is_fatal(tiny_multi30k):
    for listing in (SPLITS1 + "/val.txt", SPLITS2 + "/val_images.txt"):
        write_text(tiny_multi30k / listing, ["100.jpg"])  # also in train
    message = fatal(tiny_multi30k)
    assert f"{SPLITS1}/val.txt:1: image 100.jpg of split val is also in split train" in message


def test_missing_split_file_is_fatal(tiny_multi30k):
    for path in tiny_multi30k.rglob("*test_2016*"):
        path.unlink()
    assert "split 'test_2016' not found: expected data/task1/image_splits/test_2016_flickr.txt" in fatal(tiny_multi30k)


def test_missing_language_file_is_fatal(tiny_multi30k):
    (tiny_multi30k / T1 / "val.cs.gz").unlink()
    message = fatal(tiny_multi30k)
    assert f"split 'val' has no cs captions: expected {T1}/val.cs.gz" in message
    assert "leave cs out of data.languages" in message
    # ... and not when the config leaves the language out
    result = read_multi30k(tiny_multi30k, "tiny", options=ReadOptions(languages=("en", "de", "fr")))
    assert {c["lang"] for c in result.captions.to_pylist()} == {"en", "de", "fr"}


def test_empty_dataset_is_fatal(tiny_multi30k):
    set_train_images(tiny_multi30k, [], {lang: [] for lang in LANGS})
    assert f"{SPLITS1}/train.txt lists no images: split 'train' is empty" in fatal(tiny_multi30k)


def test_a_language_whose_every_line_is_rejected_is_fatal(tiny_multi30k):
    write_gz(tiny_multi30k / T1 / "train.cs.gz", ["", "  "])
    assert "split 'train': every cs caption line was rejected" in fatal(tiny_multi30k)


# -- soft: the line goes to rejects with file, line, kind, reason and raw bytes -----------


def test_invalid_utf8_empty_whitespace_and_control_characters_are_rejected(tiny_multi30k):
    write_gz(tiny_multi30k / T1 / "train.fr.gz", b"Un chien \xe9 brun.\nDeux hommes discutent.\n")
    write_gz(tiny_multi30k / T2 / "train.1.de.gz", b" \t \nZwei M\xc3\xa4nner reden.\n")
    write_gz(tiny_multi30k / T1 / "train.cs.gz", b"\nDva mu\xc5\xbei.\n")
    write_gz(tiny_multi30k / T1 / "train.de.gz", b"Ein brauner Hund.\nZwei \x1b[31mplaudern.\n")
    result = read(tiny_multi30k)
    rejects = rejects_of(result)
    assert rejects[(f"{T1}/train.fr.gz", 1)]["kind"] == "invalid_utf8"
    assert rejects[(f"{T1}/train.fr.gz", 1)]["reason"] == "invalid UTF-8 at byte 9"
    assert rejects[(f"{T1}/train.fr.gz", 1)]["raw_bytes"] == b"Un chien \xe9 brun."
    assert rejects[(f"{T2}/train.1.de.gz", 1)]["kind"] == "empty"  # whitespace only
    assert rejects[(f"{T1}/train.cs.gz", 1)]["kind"] == "empty"
    assert rejects[(f"{T1}/train.de.gz", 2)]["reason"] == "control character U+001B at column 6"
    # The neighbours stay; so does image 100, through its other captions.
    assert {"Deux hommes discutent.", "Zwei Männer reden."} <= texts_of(result)
    assert result.stats["train"] == {"images": 2, "cs": 1, "de": 4, "en": 5, "fr": 1}


def test_a_control_character_is_any_of_unicode_s_category_cc_but_the_tab():
    import unicodedata

    from mule.datasets.readers.base import CONTROL, clean_caption

    for code in range(0x3000):  # Cc lies below U+00A0; the rest of the BMP's first plane, for good measure
        char = chr(code)
        assert bool(CONTROL.match(char)) == (unicodedata.category(char) == "Cc" and char != "\t"), hex(code)
    assert clean_caption("Zwei\u0085Männer".encode(), 100) == (
        None, "control_char", "control character U+0085 at column 5")  # fmt: skip
    assert clean_caption(b"tab\tseparated", 100) == ("tab\tseparated", "", "")


def peak_mb_of(fn) -> float:
    """Peak of Python's allocations (tracemalloc) while fn runs."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_an_absurdly_long_caption_is_rejected_without_reading_it_whole(tiny_multi30k):
    baseline_mb = peak_mb_of(lambda: read(tiny_multi30k))
    long_line = b"word " * 4_000_000  # 20 MB on one line
    write_gz(tiny_multi30k / T1 / "train.fr.gz", long_line + b"\nDeux hommes discutent.\n")
    results = []
    extra_mb = peak_mb_of(lambda: results.append(read(tiny_multi30k))) - baseline_mb
    reject = rejects_of(results[0])[(f"{T1}/train.fr.gz", 1)]
    assert reject["kind"] == "too_long"
    assert reject["reason"] == "caption of 20000000 bytes (data.max_caption_bytes=2000)"
    assert len(reject["raw_bytes"]) == 2000  # the head is kept, not the 20 MB
    assert extra_mb < 5  # read in bounded chunks: the whole line would take 20 MB
    assert "Deux hommes discutent." in texts_of(results[0])


def test_duplicate_image_within_a_split_is_rejected_with_its_captions(tiny_multi30k):
    names = ["100.jpg", "200.jpg", "100.jpg"]
    set_train_images(tiny_multi30k, names, {lang: [f"{lang} one", f"{lang} two", f"{lang} three"] for lang in LANGS})
    result = read(tiny_multi30k)
    rejects = rejects_of(result)
    assert rejects[(f"{SPLITS1}/train.txt", 3)]["kind"] == "duplicate_image"
    assert rejects[(f"{SPLITS1}/train.txt", 3)]["reason"] == "image 100.jpg already listed at line 1"
    assert rejects[(f"{T1}/train.de.gz", 3)]["kind"] == "no_image"
    assert "data/task1/image_splits/train.txt:3 was rejected" in rejects[(f"{T1}/train.de.gz", 3)]["reason"]
    assert "de three" not in texts_of(result) and "de one" in texts_of(result)
    assert result.stats["train"]["images"] == 2


def test_an_image_left_without_captions_is_rejected_and_not_kept(tiny_multi30k):
    set_train_images(tiny_multi30k, ["100.jpg", "200.jpg"], {lang: [f"{lang} one", ""] for lang in LANGS})
    result = read(tiny_multi30k)
    reject = rejects_of(result)[(f"{SPLITS1}/train.txt", 2)]
    assert reject["kind"] == "no_captions" and "200.jpg has no usable caption" in reject["reason"]
    assert "200" not in result.images.column("image_id").to_pylist()


def test_trailing_blank_lines_and_crlf_are_accepted_silently(tiny_multi30k):
    clean = read(tiny_multi30k)
    for listing in (SPLITS1 + "/train.txt", SPLITS2 + "/train_images.txt"):
        (tiny_multi30k / listing).write_bytes(b"100.jpg\r\n200.jpg\r\n\r\n\n")
    with gzip.open(tiny_multi30k / T1 / "train.fr.gz", "wb") as handle:
        handle.write(b"Un chien brun.\r\nDeux hommes discutent.\r\n\r\n\n")
    result = read(tiny_multi30k)
    assert result.rejects.num_rows == 0
    assert result.captions.to_pylist() == clean.captions.to_pylist()


def test_a_blank_line_among_image_names_is_rejected_with_its_captions(tiny_multi30k):
    set_train_images(
        tiny_multi30k, ["100.jpg", "", "200.jpg"], {lang: [f"{lang} a", f"{lang} b", f"{lang} c"] for lang in LANGS}
    )
    result = read(tiny_multi30k)
    rejects = rejects_of(result)
    assert rejects[(f"{SPLITS1}/train.txt", 2)]["kind"] == "blank_image_line"
    assert rejects[(f"{T1}/train.en.gz", 2)]["kind"] == "no_image"
    assert {"en a", "en c"} <= texts_of(result) and "en b" not in texts_of(result)


def test_a_language_the_config_does_not_know_is_skipped_and_recorded(tiny_multi30k):
    write_gz(tiny_multi30k / T1 / "train.it.gz", ["Un cane marrone.", "Due uomini."])
    result = read(tiny_multi30k)
    reject = rejects_of(result)[(f"{T1}/train.it.gz", None)]
    assert reject["kind"] == "unknown_language"
    assert reject["reason"] == "language 'it' is not in data.languages (en, de, fr, cs): file skipped"
    assert "it" not in {c["lang"] for c in result.captions.to_pylist()}


@pytest.mark.parametrize("name", ["../secret.jpg", "/etc/hostname", "sub/100.jpg", "..\\secret.jpg", "C:secret.jpg"])
def test_names_that_would_resolve_outside_the_images_folder_are_rejected(tiny_multi30k, name):
    (tiny_multi30k / "secret.jpg").write_bytes(b"outside the images folder")
    (tiny_multi30k / "images").mkdir()
    set_train_images(tiny_multi30k, ["100.jpg", name], {lang: [f"{lang} a", f"{lang} b"] for lang in LANGS})
    result = read(tiny_multi30k)
    reject = rejects_of(result)[(f"{SPLITS1}/train.txt", 2)]
    assert reject["kind"] == "unsafe_image_name" and repr(name) in reject["reason"]
    paths = result.images.column("path").to_pylist()
    assert all(Path(p).parent == tiny_multi30k / "images" for p in paths)  # nothing else was looked at


# -- strict: every soft case becomes fatal ------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda root: write_gz(root / T1 / "train.fr.gz", b"\xff\nDeux.\n"), f"{T1}/train.fr.gz:1: invalid UTF-8"),
        (lambda root: write_gz(root / T1 / "train.fr.gz", ["", "Deux."]), f"{T1}/train.fr.gz:1: empty caption"),
        (lambda root: write_gz(root / T1 / "train.it.gz", ["a", "b"]), f"{T1}/train.it.gz: language 'it'"),
    ],
)
def test_strict_makes_every_reject_an_error(tiny_multi30k, mutate, where):
    mutate(tiny_multi30k)
    assert read(tiny_multi30k).rejects.num_rows > 0  # soft by default
    message = fatal(tiny_multi30k, strict=True)
    assert where in message and "data.strict=true makes this an error" in message


# -- the command line: a fatal case is one line and exit code 2 -----------------------------
# Every fatal case above raises a UserError, which `mule` turns into that line and exit 2;
# four of them go through the real command here (each costs a Prefect flow run).


def _misaligned(root):
    write_gz(root / T1 / "train.cs.gz", ["a", "b", "c"])


def _truncated(root):
    path = root / T1 / "train.fr.gz"
    path.write_bytes(path.read_bytes()[:-12])


def _in_two_splits(root):
    for listing in (SPLITS1 + "/val.txt", SPLITS2 + "/val_images.txt"):
        write_text(root / listing, ["100.jpg"])


def _no_language(root):
    (root / T1 / "val.cs.gz").unlink()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_truncated, f"{T1}/train.fr.gz: not a readable gzip file"),
        (_misaligned, f"{T1}/train.cs.gz has 3 lines but {SPLITS1}/train.txt lists 2 images"),
        (_in_two_splits, f"{SPLITS1}/val.txt:1: image 100.jpg of split val is also in split train"),
        (_no_language, f"split 'val' has no cs captions: expected {T1}/val.cs.gz"),
    ],
)
def test_the_command_line_stops_with_one_line_and_exit_code_2(tiny_multi30k, tmp_path, capsys, mutate, message):
    from mule.commands.main import main

    mutate(tiny_multi30k)
    code = main(["run", "ingest", "--workdir", str(tmp_path / "work"), "--dataset", "tiny",
                 "--source", str(tiny_multi30k)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("mule: error: ") and message in err[-1] and str(tiny_multi30k) in err[-1]
    assert not (tmp_path / "work" / "catalog" / "captions").exists()  # nothing half-ingested
