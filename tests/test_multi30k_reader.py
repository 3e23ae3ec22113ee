"""The Multi30K reader on hand-written files in the official layout."""

import gzip

import pytest

from mule.datasets.readers.multi30k import Multi30kError, read_multi30k
from tests.conftest import write_gz


def test_counts_provenance_and_the_task1_merge(tiny_multi30k):
    result = read_multi30k(tiny_multi30k, "tiny")
    captions = result.captions.to_pylist()
    assert result.stats["train"] == {"images": 2, "cs": 2, "de": 6, "en": 5, "fr": 2}
    assert result.stats["test_2016"]["images"] == 1
    # "A brown dog." is task1's line and task2's second caption of image 100: one row, not two.
    brown = [c for c in captions if c["text"] == "A brown dog."]
    assert len(brown) == 1
    assert brown[0]["source"] == "multi30k/task2"
    assert brown[0]["caption_id"] == "data/task2/raw/train.2.en.gz:1"
    assert brown[0]["also_in"] == "data/task1/raw/train.en.gz:1"
    # "Two men chatting." is not among image 200's task2 lines: kept as a task1 row.
    chatting = [c for c in captions if c["text"] == "Two men chatting."]
    assert chatting[0]["source"] == "multi30k/task1" and chatting[0]["image_id"] == "200"
    # Translations point at the English line they translate.
    french = {c["text"]: c for c in captions if c["lang"] == "fr"}
    assert french["Un chien brun."]["origin_caption_id"] == "data/task2/raw/train.2.en.gz:1"
    assert french["Deux hommes discutent."]["origin_caption_id"] == "data/task1/raw/train.en.gz:2"
    assert result.merged_task1_lines == 3  # train image 100, val, test
    assert {c["split"] for c in captions} == {"train", "val", "test_2016"}
    assert {c["role"] for c in captions} == {"train", "val", "test"}


def test_missing_images_are_recorded_not_invented(tiny_multi30k):
    (tiny_multi30k / "images").mkdir()
    from PIL import Image

    Image.new("RGB", (8, 6), "red").save(tiny_multi30k / "images" / "100.jpg")
    images = {r["image_id"]: r for r in read_multi30k(tiny_multi30k, "tiny").images.to_pylist()}
    assert images["100"]["exists"] and len(images["100"]["sha256"]) == 64 and images["100"]["width"] == 8
    assert not images["200"]["exists"] and images["200"]["sha256"] is None


def test_bad_lines_are_rejected_with_file_line_and_reason(tiny_multi30k):
    raw = tiny_multi30k / "data/task2/raw"
    write_gz(raw / "train.1.en.gz", b"A dog runs.\n   \n")  # line 2 empty
    write_gz(raw / "train.1.de.gz", b"Ein Hund \xff rennt.\nZwei M\xc3\xa4nner reden.\n")  # line 1 bad UTF-8
    write_gz(raw / "train.2.de.gz", b"Ein brauner\x07 Hund.\nM\xc3\xa4nner bei der Arbeit.\n")  # control char
    result = read_multi30k(tiny_multi30k, "tiny")
    rejects = {(r["source_file"], r["line"]): r for r in result.rejects.to_pylist()}
    assert rejects[("data/task2/raw/train.1.en.gz", 2)]["reason"] == "empty caption"
    assert rejects[("data/task2/raw/train.1.en.gz", 2)]["kind"] == "empty"
    assert rejects[("data/task2/raw/train.1.de.gz", 1)]["reason"].startswith("invalid UTF-8 at byte 9")
    assert "\\xff" in rejects[("data/task2/raw/train.1.de.gz", 1)]["raw"]  # the raw bytes are kept
    assert rejects[("data/task2/raw/train.1.de.gz", 1)]["raw_bytes"] == b"Ein Hund \xff rennt."
    assert rejects[("data/task2/raw/train.2.de.gz", 1)]["reason"] == "control character U+0007 at column 12"
    texts = result.captions.column("text").to_pylist()
    assert "Zwei Männer reden." in texts and "Männer bei der Arbeit." in texts  # neighbours survive


def test_misaligned_files_are_an_error_naming_both_files(tiny_multi30k):
    write_gz(tiny_multi30k / "data/task2/raw/train.3.en.gz", ["only one line"])
    with pytest.raises(Multi30kError) as error:
        read_multi30k(tiny_multi30k, "tiny")
    assert "data/task2/raw/train.3.en.gz has 1 lines" in str(error.value)
    assert "data/task1/image_splits/train.txt lists 2 images" in str(error.value)


def test_split_files_that_disagree(tiny_multi30k):
    (tiny_multi30k / "data/task2/image_splits/val_images.txt").write_text("999.jpg\n")
    with pytest.raises(Multi30kError, match="val.txt and data/task2/image_splits/val_images.txt disagree at line 1"):
        read_multi30k(tiny_multi30k, "tiny")


def test_not_a_checkout(tmp_path):
    with pytest.raises(Multi30kError, match="not a Multi30K checkout"):
        read_multi30k(tmp_path, "x")


def test_missing_required_split(tiny_multi30k):
    for path in tiny_multi30k.rglob("*val*"):
        path.unlink()
    with pytest.raises(Multi30kError, match="split 'val' not found"):
        read_multi30k(tiny_multi30k, "tiny")


def test_reads_gzip_without_final_newline(tiny_multi30k):
    with gzip.open(tiny_multi30k / "data/task1/raw/val.cs.gz", "wb") as handle:
        handle.write("Kočka spí.".encode())
    assert "Kočka spí." in read_multi30k(tiny_multi30k, "tiny").captions.column("text").to_pylist()
