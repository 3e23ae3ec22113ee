"""Translate: human captions -> machine-translated captions, for the languages with few.

Reads the human captions of `translate.splits` (train and val; never test), translates
each language pair of `translate.pairs` (default: English into every other language and
every other language into English) with `translate.backend`, and writes

- `translations` (the cache: backend, version, languages, source text hash, text, time),
- `captions/<dataset>.mt.parquet`: one caption per translated caption, `source` =
  `mt:<backend>`, `origin_caption_id` = the caption it translates, tokenised like human ones.

Each translation is appended to a journal (fsync'd) the moment it arrives, so an
interrupted run resumes where it stopped and a rerun never asks for a text twice; the
journal is folded into the Parquet table at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from mule.data_catalog import queries
from mule.data_catalog.schemas import CAPTIONS, TRANSLATIONS
from mule.data_catalog.sources import locate
from mule.data_catalog.tables import Catalog
from mule.datasets.lexicons import LexiconError, read_muse
from mule.mule_core.errors import UserError
from mule.mule_core.languages import language_pair
from mule.mule_core.progress import SHOWN, Progress
from mule.mule_core.tokenizers import tokenizer_names
from mule.mule_core.vocabulary import tokenize
from mule.storage.atomic import point
from mule.tasks.shared.context import StageContext, logger
from mule.tasks.shared.token_identity import caption_tokenizers
from mule.words.translation import WordTable, best_translations, ibm_model1

if TYPE_CHECKING:
    from mule.config.sections import MuleConfig

ENGLISH = "en"


class TranslateError(UserError):
    pass


def language_pairs(cfg: MuleConfig) -> list[tuple[str, str]]:
    if cfg.translate.pairs:  # en-pt-BR: en -> pt-BR (mule_core.languages.language_pair)
        return [language_pair(p, ("en", *cfg.data.languages)) for p in cfg.translate.pairs]
    others = [lang for lang in cfg.data.languages if lang != ENGLISH]
    return [(ENGLISH, lang) for lang in others] + [(lang, ENGLISH) for lang in others]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- backends ------------------------------------------------------------------------------


class WordByWord:
    """lexicon / induced: a word table per language pair; sentences go through it at once."""

    # Its output is tokens joined by spaces: split, they are the caption's tokens.
    output_is_tokenised = True

    def __init__(self, name: str, version: str, tables: dict[tuple[str, str], WordTable]):
        self.name, self.version, self.tables = name, version, tables
        self.unknown_words = 0
        self.tokens_of: dict[str, list[str]] = {}  # the catalog's tokens of the texts, to skip tokenising again
        self.tokenizers: dict[str, str] = {}  # text.tokenizers

    def translate(self, texts, src, dest, on_result):
        table = self.tables.get((src, dest))
        if table is None:
            raise TranslateError(f"the {self.name} backend has no {src}->{dest} word table")
        for index, text in enumerate(texts):
            tokens = self.tokens_of.get(text) or tokenize(text, src, self.tokenizers)
            words, missing = table.translate(tokens)
            self.unknown_words += missing
            on_result(index, " ".join(words), "")


def lexicon_backend(cfg: MuleConfig, wd, pairs, required: bool = True) -> WordByWord:
    """Word tables from MUSE lexicons. A pair without its lexicon is an error when the
    translations are `required` (training reads them: data.captions uses MT); otherwise it
    is left untranslated, and the backend's `missing` says which and where it looked."""
    source = locate(wd, cfg.data)
    folder = cfg.data.dictionaries or str(source.root / "dictionaries")
    tables, missing = {}, {}
    for src, dest in pairs:
        other = dest if src == ENGLISH else src
        path = os.path.join(folder, f"{ENGLISH}-{other}.txt")
        if not os.path.exists(path):
            if not required:
                missing[f"{src}-{dest}"] = f"no lexicon at {path}"
                continue
            raise LexiconError(f"no {ENGLISH}-{other} lexicon at {path} (MUSE format): set data.dictionaries, "
                               "or use translate.backend=induced")  # fmt: skip
        entries = read_muse(path)  # (English word, other word)
        if src != ENGLISH:
            entries = [(b, a) for a, b in entries]
        table: dict[str, str] = {}
        for word, translation in entries:
            table.setdefault(word, translation)  # MUSE lists the most frequent translation first
        tables[(src, dest)] = WordTable(table)
    digest = hashlib.sha256(repr(sorted((k, sorted(v.entries.items())) for k, v in tables.items())).encode())
    backend = WordByWord("lexicon", f"lexicon-{digest.hexdigest()[:12]}", tables)
    backend.missing = missing
    return backend


def induced_backend(cfg: MuleConfig, catalog: Catalog, pairs, required: bool = True) -> WordByWord:
    """IBM Model 1 on the training split's parallel captions (a translation and the caption
    it translates). A pair they do not cover is an error when `required`; otherwise
    (translate.backend=auto) it is left untranslated, and the backend's `missing` says which."""
    dataset = cfg.data.dataset
    rows = queries.parallel_training_captions(catalog, dataset)
    tables, sizes, missing = {}, {}, {}
    for src, dest in pairs:
        forward = [(r["src_tokens"], r["dest_tokens"]) for r in rows if (r["src_lang"], r["dest_lang"]) == (src, dest)]
        backward = [(r["dest_tokens"], r["src_tokens"]) for r in rows if (r["src_lang"], r["dest_lang"]) == (dest, src)]
        parallel = forward + backward
        if not parallel:
            if not required:
                missing[f"{src}-{dest}"] = f"no parallel {src}-{dest} training captions in {dataset!r}"
                continue
            raise TranslateError(f"no parallel {src}-{dest} training captions in {dataset!r} to learn a word table "
                                 "from (the induced backend needs translated captions, like Multi30K's task1)")  # fmt: skip
        tables[(src, dest)] = best_translations(ibm_model1(parallel, cfg.translate.induced_iterations))
        sizes[f"{src}-{dest}"] = len(parallel)
    digest = hashlib.sha256(repr(sorted((k, sorted(v.entries.items())) for k, v in tables.items())).encode())
    backend = WordByWord("induced", f"ibm1-{cfg.translate.induced_iterations}it-{digest.hexdigest()[:12]}", tables)
    backend.missing = missing
    return backend


def aligned_backend(cfg: MuleConfig, catalog: Catalog, pairs, captions: list[dict]) -> WordByWord:
    """Each source word (of the captions to translate) to its nearest target word by
    multilingual-e5 (words/aligned.py: word_table): the target's caption words
    and its commonest words. No parallel text and no lexicon, for any pair e5 reads."""
    from mule.words.common import common_words
    from mule.words.encoder import encoder_version
    from mule.words.translation import word_table

    words: dict[str, dict[str, None]] = {}
    for caption in captions:
        words.setdefault(caption["lang"], {}).update(dict.fromkeys(caption["tokens"] or ()))
    tables = {}
    for src, dest in pairs:
        candidates = list(dict.fromkeys([*words.get(dest, {}),
                                         *common_words(dest, cfg.translate.aligned_words, cfg.text.tokenizers)]))  # fmt: skip
        if not words.get(src) or not candidates:
            raise TranslateError(f"the aligned backend has no {src} words to translate or no {dest} words to "
                                 "translate into")  # fmt: skip
        tables[(src, dest)] = WordTable(word_table(list(words[src]), src, dest, candidates, cfg.text.tokenizers))
    digest = hashlib.sha256(repr(sorted((k, sorted(v.entries.items())) for k, v in tables.items())).encode())
    return WordByWord("aligned", f"e5-nearest-{encoder_version().replace(' ', '-')}-{digest.hexdigest()[:12]}", tables)


class ArgosBackend:
    name = "argos"

    def __init__(self):
        try:
            from importlib.metadata import version

            import argostranslate.translate as argos
        except ImportError:
            raise TranslateError("translate.backend=argos needs argostranslate: pip install 'mule[argos]'") from None
        self._argos = argos
        self.version = f"argos-{version('argostranslate')}"

    def translate(self, texts, src, dest, on_result):
        installed = {lang.code for lang in self._argos.get_installed_languages()}
        missing = [code for code in (src, dest) if code not in installed]
        if missing:
            raise TranslateError(f"argostranslate has no {src}->{dest} package installed (missing: {', '.join(missing)}); "
                                 f"install it with argospm install translate-{src}_{dest}")  # fmt: skip
        for index, text in enumerate(texts):
            on_result(index, self._argos.translate(text, src, dest), "")


def make_backend(cfg: MuleConfig, wd, catalog: Catalog, pairs, captions: list[dict]):
    backend = cfg.translate.backend
    if backend == "lexicon":  # without MT in training (data.captions=human), a missing lexicon skips its pair
        return lexicon_backend(cfg, wd, pairs, required=cfg.data.captions != "human")
    if backend == "induced":
        return induced_backend(cfg, catalog, pairs)
    if backend == "auto":  # induced where the dataset's own parallel captions cover a pair (Multi30K's task1)
        return induced_backend(cfg, catalog, pairs, required=False)
    if backend == "aligned":
        return aligned_backend(cfg, catalog, pairs, captions)
    if backend == "googletrans":
        from mule.clients.googletrans import GoogleOptions, GoogleTranslateBackend

        t = cfg.translate
        return GoogleTranslateBackend(
            GoogleOptions(concurrency=t.concurrency, timeout_s=t.timeout_s, retries=t.retries)
        )
    return ArgosBackend()


# -- the cache -------------------------------------------------------------------------------


class TranslationCache:
    """The translations table plus an append-only journal of what arrived since it was written."""

    def __init__(self, catalog: Catalog, dataset: str, durable: bool = True):
        self.catalog, self.dataset, self.durable = catalog, dataset, durable
        self.table_path = catalog.workdir.table_path("translations", dataset)
        self.journal_path = self.table_path.with_name(f"{dataset}.journal.jsonl")
        self.rows: dict[tuple, dict] = {}
        if self.table_path.exists():
            try:
                for row in pq.read_table(self.table_path).to_pylist():
                    self.rows[self.key(row)] = row
            except (OSError, pa.ArrowException) as error:  # damaged: what it held is translated again
                logger().warning("the translations table %s is unreadable (%s): its sentences are translated again",
                                 self.table_path, str(error).splitlines()[0][:120])  # fmt: skip
        cut = False
        if self.journal_path.exists():
            data = self.journal_path.read_bytes()
            for line in data.splitlines():
                try:
                    row = json.loads(line)
                    self.rows[self.key(row)] = row
                except (ValueError, KeyError, TypeError):  # a killed run's last line, cut short; a damaged one
                    continue
            cut = bool(data) and not data.endswith(b"\n")
        self.journal_path.parent.mkdir(parents=True, exist_ok=True)
        self._journal = open(self.journal_path, "a", encoding="utf-8")
        if cut:  # a crash cut the last line: end it, so the next translation is a line of its own
            self._journal.write("\n")

    @staticmethod
    def key(row: dict) -> tuple:
        return row["backend"], row["backend_version"], row["source_lang"], row["target_lang"], row["source_sha256"]

    def get(self, backend, version, src, dest, text) -> str | None:
        row = self.rows.get((backend, version, src, dest, sha(text)))
        return row["text"] if row else None

    def put(self, backend, version, src, dest, source_text, text) -> None:
        row = {"dataset": self.dataset, "backend": backend, "backend_version": version, "source_lang": src,
               "target_lang": dest, "source_sha256": sha(source_text), "source_text": source_text, "text": text,
               "created": time.time()}  # fmt: skip
        self.rows[self.key(row)] = row
        self._journal.write(json.dumps(row, ensure_ascii=False) + "\n")
        if self.durable:  # a request's answer is on disk before the next request is made
            self._journal.flush()
            os.fsync(self._journal.fileno())
        point(f"journal:{self.dataset}")  # storage.atomic's seam: a test may stop the run here

    def commit(self) -> None:
        """The journal folded into the table (atomic), then emptied."""
        self._journal.close()
        rows = sorted(self.rows.values(), key=self.key)
        table = pa.Table.from_pylist(rows, schema=TRANSLATIONS) if rows else TRANSLATIONS.empty_table()
        self.catalog.write_table("translations", self.dataset, table)
        self.journal_path.unlink(missing_ok=True)


# -- the stage -------------------------------------------------------------------------------


def compute(ctx: StageContext) -> dict[str, Any]:
    wd, catalog, cfg = ctx.workdir, ctx.catalog, ctx.cfg
    log, dataset = logger(), cfg.data.dataset
    started = time.perf_counter()
    pairs = [(s, d) for s, d in language_pairs(cfg) if s in cfg.data.languages and d in cfg.data.languages]
    captions = queries.human_captions_to_translate(catalog, dataset, cfg.translate.splits)
    # MT captions are split into words as the human ones were, by the tokenisers that made those
    tokenizers = tokenizer_names(caption_tokenizers(catalog, dataset, cfg.data.languages, cfg.text.tokenizers,
                                                    "translate"))  # fmt: skip
    backend = make_backend(cfg, wd, catalog, pairs, captions)
    missing = getattr(backend, "missing", {})
    if missing:
        advice = ("Set data.dictionaries, or translate.backend=induced, to translate them" if backend.name == "lexicon"
                  else "translate.backend=aligned translates any pair without parallel text")  # fmt: skip
        log.warning("translate: %s left untranslated (%s); training reads their human captions only. %s",
                    ", ".join(missing), "; ".join(sorted(set(missing.values()))), advice)  # fmt: skip
        pairs = [(s, d) for s, d in pairs if f"{s}-{d}" not in missing]
    if hasattr(backend, "tokens_of"):
        backend.tokens_of = {c["text"]: c["tokens"] for c in captions}
        backend.tokenizers = tokenizers
    # Word tables translate thousands of sentences a second: redoing them costs less than an fsync each.
    cache = TranslationCache(catalog, dataset, durable=not getattr(backend, "output_is_tokenised", False))
    counts: Counter = Counter()
    failures: list[dict] = []
    out: list[dict] = []
    try:
        for src, dest in pairs:
            sources = [c for c in captions if c["lang"] == src]
            todo = sorted(
                {c["text"] for c in sources if cache.get(backend.name, backend.version, src, dest, c["text"]) is None}
            )
            counts["cache_hits"] += len({c["text"] for c in sources}) - len(todo)
            progress = Progress(f"translating {src}->{dest} ({backend.name})", len(todo), unit="sentences", logger=log)

            def on_result(index: int, text: str | None, reason: str, src=src, dest=dest, todo=todo, progress=progress):
                progress.update(1)
                if text is None:
                    failures.append({"source_lang": src, "target_lang": dest, "text": todo[index], "reason": reason})
                    return
                cache.put(backend.name, backend.version, src, dest, todo[index], text)
                counts["translated"] += 1

            if todo:
                backend.translate(todo, src, dest, on_result)
            progress.finish()
            for caption in sources:
                text = cache.get(backend.name, backend.version, src, dest, caption["text"])
                if text:
                    out.append({**caption, "tokens": None, "lang": dest, "text": text, "origin_caption_id": caption["caption_id"],
                                "caption_id": f"{queries.mt_source(backend.name)}:{dest}:{caption['caption_id']}"})  # fmt: skip
    finally:
        cache.commit()  # whatever arrived is kept, even when the service gave up

    table = mt_captions_table(dataset, out, backend, tokenizers)
    catalog.write_table("captions", f"{dataset}.mt", table)
    stats = getattr(backend, "stats", None)
    summary = {
        "backend": backend.name, "backend_version": backend.version, "pairs": [f"{s}-{d}" for s, d in pairs],
        "untranslated_pairs": sorted(missing),
        "splits": list(cfg.translate.splits), "mt_captions": table.num_rows, "translated_now": counts["translated"],
        "cache_hits": counts["cache_hits"], "failures": len(failures),
        "requests": stats.requests if stats else 0, "retries": stats.retries if stats else 0,
        "unknown_words": getattr(backend, "unknown_words", 0), "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    log.info("translate (%s): %d MT captions; %d translated now, %d from the cache, %d failed, %d requests, %d retries",
             backend.name, table.num_rows, counts["translated"], counts["cache_hits"], len(failures),
             summary["requests"], summary["retries"], extra=SHOWN)  # fmt: skip
    return summary | {"failed": failures[:1000]}


def mt_captions_table(dataset: str, rows: list[dict], backend, tokenizers: dict[str, str] | None = None) -> pa.Table:
    columns: dict[str, list] = {name: [] for name in CAPTIONS.names}
    for row in rows:
        values = {"dataset": dataset, "caption_id": row["caption_id"], "image_id": row["image_id"],
                  "split": row["split"], "role": row["role"], "lang": row["lang"], "text": row["text"],
                  "tokens": row["text"].split() if getattr(backend, "output_is_tokenised", False)
                  else tokenize(row["text"], row["lang"], tokenizers), "source": queries.mt_source(backend.name), "source_file": None,
                  "line": None, "origin_caption_id": row["origin_caption_id"], "also_in": None,
                  "source_version": backend.version}  # fmt: skip
        for name in CAPTIONS.names:
            columns[name].append(values[name])
    return pa.table(columns, schema=CAPTIONS)
