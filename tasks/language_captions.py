"""The language-captions step of add-language: the captions a language added to a trained
model has of the dataset's images, from where the run says, each source said in one line:

- the dataset's own files in that language (a table layout's rows of it: the rebuild read
  only data.languages; Multi30K's and COCO's files have none of the languages they lack);
- data.extra_captions' files in it (xFlickr&CO's `es/train_100.jsonl`);
- the tables add.captions names (`mule run add-language --lang es --captions FILE`).

They go, tokenised, to a table of their own (data_catalog.queries.added_dataset: captions
of `<dataset>+<lang>`), with their rejects beside: no stage of the rebuild reads it, so the
base model's data, and its stages' keys, stay as they were. With none, the language is
added from zero captions (its aligned start: tasks/extend.py).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mule.data_catalog import queries
from mule.data_catalog.schemas import CAPTIONS, REJECTS
from mule.data_catalog.sources import locate
from mule.datasets.formats import FORMATS
from mule.datasets.readers.added_captions import read_added_captions
from mule.datasets.readers.base import ReadOptions
from mule.datasets.readers.table import CAPTION_COLUMNS
from mule.datasets.readers.xflickrco import parse_files, provided_languages, read_extra_captions
from mule.mule_core.progress import SHOWN, Progress
from mule.mule_core.tokenizers import tokenizer_version
from mule.storage.content_digests import FileHasher
from mule.tasks.ingest import tokenised
from mule.tasks.shared.context import StageContext, logger


def compute(ctx: StageContext) -> dict[str, Any]:
    wd, catalog, cfg, log = ctx.workdir, ctx.catalog, ctx.cfg, logger()
    lang, dataset = cfg.add.adding, cfg.data.dataset
    target = queries.added_dataset(dataset, lang)
    started = time.perf_counter()
    images = queries.image_names(catalog, dataset)
    options = ReadOptions((lang,), cfg.data.strict, cfg.data.max_caption_bytes, optional=(lang,))
    parts, rejects, sources = [], [], {}

    own = _dataset_rows(wd, cfg, lang, images, options, log)
    parts.append(own)
    sources["dataset"] = len(own)
    if cfg.data.extra_captions:
        folder = Path(cfg.data.extra_captions).expanduser()
        files = parse_files(cfg.data.extra_files)
        if provided_languages(folder, files, (lang,)):
            extra = read_extra_captions(folder, files, dataset, images, options, CAPTION_COLUMNS, REJECTS)
            parts.append(extra.captions)
            rejects.append(extra.rejects)
            sources["data.extra_captions"] = extra.captions.num_rows
    for path in cfg.add.caption_files(lang):
        read = read_added_captions(Path(path), lang, dataset, images, options, cfg.data.encoding)
        parts.append(read.captions)
        rejects.append(read.rejects)
        sources[str(path)] = read.captions.num_rows
        others = read.notes["other_languages"]
        if others:
            log.info("%s: %s left out (not %s)", path, ", ".join(f"{n} {x}" for x, n in sorted(others.items())),
                     lang, extra=SHOWN)  # fmt: skip
    captions, repeated = _once(pa.concat_tables([p.cast(CAPTION_COLUMNS) for p in parts]), dataset)
    rejects.append(repeated)
    rejected = pa.concat_tables([r.cast(REJECTS) for r in rejects])
    captions = captions.set_column(captions.schema.get_field_index("dataset"), "dataset",
                                   pa.array([target] * captions.num_rows, pa.string()))  # fmt: skip
    rejected = rejected.set_column(rejected.schema.get_field_index("dataset"), "dataset",
                                   pa.array([target] * rejected.num_rows, pa.string()))  # fmt: skip
    progress = Progress(f"tokenising {lang}", captions.num_rows, unit="captions", logger=log)
    words = tokenised(list(zip(captions.column("text").to_pylist(), captions.column("lang").to_pylist())),
                      cfg.text.tokenizers, progress)  # fmt: skip
    progress.finish()
    table = captions.append_column("tokens", pa.array(words, pa.list_(pa.string()))).select(CAPTIONS.names)
    # the tokeniser's identity travels with its tokens, as ingest's (tasks.shared.token_identity)
    catalog.write_table_batches("captions", target, [table.cast(CAPTIONS)],
                                notes={"tokenizers": {lang: tokenizer_version(lang, cfg.text.tokenizers)}})  # fmt: skip
    catalog.write_table("rejects", target, rejected)
    per_split = dict(Counter(table.column("split").to_pylist()))
    kinds = dict(Counter(rejected.column("kind").to_pylist()))
    found = ", ".join(f"{n} from {where}" for where, n in sources.items() if n)
    if table.num_rows:
        log.info("%s: %d captions of the dataset's images (%s; by split: %s)%s", lang, table.num_rows, found,
                 ", ".join(f"{s} {n}" for s, n in sorted(per_split.items())),
                 f"; {rejected.num_rows} rejected ({', '.join(f'{n} {k}' for k, n in kinds.items())}: mule catalog "
                 "--rejects)" if rejected.num_rows else "", extra=SHOWN)  # fmt: skip
    else:
        log.info("%s: no captions of the dataset's images (none in its files%s%s): it is added from zero captions, "
                 "read by its aligned start", lang, ", data.extra_captions" if cfg.data.extra_captions else "",
                 ", the --captions tables" if cfg.add.caption_files(lang) else "", extra=SHOWN)  # fmt: skip
    return {"language": lang, "table": target, "captions": table.num_rows, "per_split": per_split,
            "sources": sources, "rejects": rejected.num_rows, "rejects_by_kind": kinds,
            "tokenizer": tokenizer_version(lang, cfg.text.tokenizers),
            "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def _dataset_rows(wd, cfg, lang: str, images: pa.Table, options: ReadOptions, log) -> pa.Table:
    """The dataset's own captions in `lang` of its images (a caption of an image the rebuild's
    ingest left out, one with no caption in data.languages, has no features: left out, said)."""
    source = locate(wd, cfg.data)
    result = FORMATS[cfg.data.format].read(source.root, replace(cfg.data, languages=(lang,)), source.images,
                                           FileHasher(wd).digest, lambda *a, **k: None, options)  # fmt: skip
    if isinstance(result.captions, pa.Table):
        captions = result.captions
    else:  # a large table's, kept on disk: its batches in this language
        try:
            captions = pa.Table.from_batches(list(result.captions.to_batches()), CAPTION_COLUMNS)
        finally:
            result.captions.close()
    captions = captions.filter(pc.equal(captions.column("lang"), lang))
    known = pc.is_in(captions.column("image_id"), value_set=images.column("image_id"))
    outside = captions.num_rows - pc.sum(known).as_py() if captions.num_rows else 0
    if outside:
        log.warning("%s: %d captions of the dataset's files name images the dataset's ingest left out (no caption in "
                    "data.languages): they have no features, and are left out", lang, outside, extra=SHOWN)  # fmt: skip
    return captions.filter(known).select(CAPTION_COLUMNS.names) if captions.num_rows else captions.select(
        CAPTION_COLUMNS.names)  # fmt: skip


def _once(captions: pa.Table, dataset: str) -> tuple[pa.Table, pa.Table]:
    """Each caption of an image once (the first source's), and the repeats as rejects."""
    seen: dict[tuple[str, str], str] = {}
    keep, rows = [], []
    for i, (image, text, caption_id, source_file, line) in enumerate(zip(
            *(captions.column(c).to_pylist() for c in ("image_id", "text", "caption_id", "source_file", "line")))):  # fmt: skip
        first = seen.setdefault((image, text), caption_id)
        if first == caption_id:
            keep.append(i)
            continue
        rows.append({"dataset": dataset, "source_file": source_file, "line": line, "kind": "duplicate",
                     "reason": f"the same caption of {image!r} as {first}", "raw": text,
                     "raw_bytes": text.encode()})  # fmt: skip
    return captions.take(pa.array(keep, pa.int64())), pa.Table.from_pylist(rows, REJECTS)
