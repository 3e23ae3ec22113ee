"""Ingest: raw dataset files -> images, captions (tokenised) and rejects tables."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from mule.data_catalog import queries
from mule.data_catalog.schemas import CAPTIONS, REJECTS
from mule.data_catalog.sources import locate
from mule.datasets.formats import FORMATS
from mule.datasets.readers.base import ChainedTables, DatasetReadError, ReadOptions, ReadResult
from mule.datasets.readers.xflickrco import parse_files, provided_languages, read_extra_captions
from mule.mule_core.devices import cpu_threads, process_map
from mule.mule_core.languages import tokenizer_name
from mule.mule_core.progress import SHOWN, Progress
from mule.mule_core.tokenizers import tokenize_all, tokenizer_version
from mule.storage.content_digests import FileHasher
from mule.tasks.shared.context import StageContext, logger

# Below this many captions the pool's start (a few tenths of a second) costs more than it saves.
TOKENISE_IN_PROCESSES_FROM = 20_000
CHUNK = 2_000
BATCH = 10_000  # captions tokenised and written at a time: memory holds a batch, not the table


@contextmanager
def tokeniser(total: int, overrides: dict[str, str], progress: Progress) -> Iterator[Callable]:
    """A function: (text, lang) pairs -> the words of each, in order; on as many processes
    as torch would take threads (OMP_NUM_THREADS, else the cores) when `total` captions are
    enough to pay for starting them. The words are the same either way."""
    processes = min(cpu_threads(0), 8, total // CHUNK) if total >= TOKENISE_IN_PROCESSES_FROM else 1
    with process_map(processes) as mapper:

        def words(pairs: list[tuple[str, str]]) -> list[list[str]]:
            distinct = list(dict.fromkeys(pairs))  # a caption repeated is tokenised once (Moses: ~40 us a caption)
            # chunks of CHUNK, or fewer and even ones: every process busy until the batch is done
            size = min(CHUNK, -(-len(distinct) // (2 * max(processes, 1)))) or 1
            chunks = [distinct[i : i + size] for i in range(0, len(distinct), size)]
            found: list[list[str]] = []
            for chunk in mapper(tokenize_all, chunks, itertools.repeat(overrides)):
                found += chunk
                progress.update(len(chunk))
            progress.update(len(pairs) - len(distinct))
            of = dict(zip(distinct, found))
            return [of[pair] for pair in pairs]

        yield words


def tokenised(pairs: list[tuple[str, str]], overrides: dict[str, str], progress: Progress) -> list[list[str]]:
    """The words of each (text, lang), in order (tokeniser's, batch by batch)."""
    with tokeniser(len(pairs), overrides, progress) as words:
        return [w for start in range(0, len(pairs), BATCH) for w in words(pairs[start : start + BATCH])]


def with_tokens(captions, words: Callable) -> Iterator[pa.Table]:
    """The reader's captions, batch by batch, with their tokens. A table the reader holds in
    memory (Multi30K, COCO) is tokenised whole first: a caption repeated anywhere in it is
    tokenised once; one it keeps on disk (a user's table, millions of rows) a batch at a time."""
    if isinstance(captions, pa.Table):
        found = words(list(zip(captions.column("text").to_pylist(), captions.column("lang").to_pylist())))
        for start in range(0, max(captions.num_rows, 1), BATCH):
            batch = captions.slice(start, BATCH)
            yield batch.append_column("tokens", pa.array(found[start : start + BATCH], pa.list_(pa.string())))
        return
    for batch in captions.to_batches(max_chunksize=BATCH):
        pairs = list(zip(batch.column("text").to_pylist(), batch.column("lang").to_pylist()))
        tokens = pa.array(words(pairs), pa.list_(pa.string()))
        yield pa.Table.from_batches([batch]).append_column("tokens", tokens)


# Where retrieval becomes useful (README, "How many images a language needs": test mR 6
# with 100 training images of a language, 45 with 1,000, 65 with 3,000)
USEFUL_IMAGES = 1000


def few_images_warning(images: dict[str, int], cfg, log) -> None:
    """A warning for each language with captions for fewer training images than USEFUL_IMAGES
    (a generated dataset's size is the user's choice: not warned)."""
    if cfg.data.dataset.startswith("embedded"):
        return
    for lang in cfg.data.languages:
        n = images.get(lang, 0)
        if n < USEFUL_IMAGES:
            log.warning("%s has captions for %d training image(s); retrieval becomes useful at about %s per language "
                        "(README: How many images a language needs): expect recalls not far above chance, or add "
                        "%s to a model trained on other languages (mule run add-language)", lang, n,
                        f"{USEFUL_IMAGES:,}", lang)  # fmt: skip


def with_extra_captions(result: ReadResult, folder: Path, cfg, options: ReadOptions, log) -> ReadResult:
    """The dataset's own captions and those data.extra_captions adds to its images (and the
    rejects of both): datasets/readers/xflickrco.py."""
    extra = read_extra_captions(folder, cfg.data.extra_files, cfg.data.dataset, result.images, options,
                                CAPTIONS.remove(CAPTIONS.get_field_index("tokens")), REJECTS)  # fmt: skip
    said = extra.notes["extra_captions"]
    log.info("%s: %s", folder, "; ".join(f"{lang} " + ", ".join(f"{n} {split}" for split, n in by_split.items())
                                          for lang, by_split in said["captions"].items()), extra=SHOWN)  # fmt: skip
    for key, n in said.items():
        if key.endswith("_alignment_digits_removed"):
            log.info("%s: the alignment digits glued to words removed from %d captions (as released; its counts are "
                     "written in kanji)", key.split("_", 1)[0], n, extra=SHOWN)  # fmt: skip
    captions = result.captions
    if isinstance(captions, pa.Table):
        captions = pa.concat_tables([captions, extra.captions.cast(captions.schema)])
    else:
        captions = ChainedTables([captions, extra.captions])
    return replace(result, captions=captions, rejects=pa.concat_tables([result.rejects, extra.rejects]),
                   notes={**result.notes, **extra.notes})


def compute(ctx: StageContext) -> dict[str, Any]:
    """Reads the raw files (images, captions; bad lines to rejects), tokenises the captions
    and writes the images, captions and rejects tables."""
    wd, catalog, cfg = ctx.workdir, ctx.catalog, ctx.cfg
    log = logger()
    source = locate(wd, cfg.data)
    started = time.perf_counter()
    extra = Path(cfg.data.extra_captions).expanduser() if cfg.data.extra_captions else None
    provided = provided_languages(extra, parse_files(cfg.data.extra_files), cfg.data.languages) if extra else ()
    options = ReadOptions(tuple(cfg.data.languages), cfg.data.strict, cfg.data.max_caption_bytes, provided)
    hasher = FileHasher(wd)  # image digests, cached by stat across runs
    try:
        result = FORMATS[cfg.data.format].read(source.root, cfg.data, source.images, hasher.digest, log.info, options)
    except DatasetReadError as error:
        if error.rejects is not None and error.rejects.num_rows:  # why rows were left out: kept for the user
            catalog.write_table("rejects", cfg.data.dataset, error.rejects)
        raise
    hasher.save()
    if extra is not None:
        result = with_extra_captions(result, extra, cfg, options, log)
    merged = (
        f"; {result.merged_task1_lines} task1 English lines merged into task2 captions" if result.merged_task1_lines else ""
    )
    log.info("read %d images, %d captions, %d rejected lines%s",
             result.images.num_rows, result.captions.num_rows, result.rejects.num_rows, merged, extra=SHOWN)  # fmt: skip
    overrides = cfg.text.tokenizers
    versions = {lang: tokenizer_version(lang, overrides) for lang in cfg.data.languages}
    for lang in cfg.data.languages:
        log.info("%s captions: tokeniser %s (%s)", lang, tokenizer_name(lang, overrides),
                 "text.tokenizers" if lang in overrides else "mule_core/languages.py's rule")  # fmt: skip

    catalog.write_table("images", cfg.data.dataset, result.images)
    progress = Progress("tokenising", result.captions.num_rows, unit="captions", logger=log)
    try:
        with tokeniser(result.captions.num_rows, overrides, progress) as words:
            # the tokenisers' identities travel with the tokens they made (tasks.shared.token_identity)
            catalog.write_table_batches("captions", cfg.data.dataset, with_tokens(result.captions, words),
                                        notes={"tokenizers": versions})  # fmt: skip
    finally:
        if hasattr(result.captions, "close"):  # a large table's captions, kept on disk until written
            result.captions.close()
    progress.finish()
    catalog.write_table("rejects", cfg.data.dataset, result.rejects)

    few_images_warning(queries.train_images_per_language(catalog, cfg.data.dataset), cfg, log)
    present = sum(result.images.column("exists").to_pylist())
    kinds = Counter(result.rejects.column("kind").to_pylist())
    if kinds:
        per_kind = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
        log.warning(
            "rejected %d lines (%s); they are in the rejects table (mule catalog)", sum(kinds.values()), per_kind
        )
    else:
        log.info("no line rejected")
    summary = {
        "source": str(source.root),
        "images_dir": str(source.images),
        "images": result.images.num_rows,
        "images_present": present,
        "captions": result.captions.num_rows,
        "rejects": result.rejects.num_rows,
        "rejects_by_kind": dict(kinds),
        "merged_task1_lines": result.merged_task1_lines,
        "per_split": result.stats,
        "tokenizers": versions,
        **result.notes,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if present < result.images.num_rows:
        log.warning(
            "%d of %d image files are missing under %s; they are recorded as missing",
            result.images.num_rows - present, result.images.num_rows, source.images,
        )  # fmt: skip
    return summary
