"""Word vectors per language: a vocabulary over the dataset's captions and a vector per
word, from a given .bin/.vec file, from fastText trained on the training captions, or
from the multilingual-e5 encoder (vectors.init)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from mule.data_catalog import queries
from mule.data_catalog.tables import Catalog
from mule.datasets.vector_files import VectorFile
from mule.mule_core import devices
from mule.mule_core.collector import bulk
from mule.mule_core.errors import InputError
from mule.mule_core.progress import SHOWN, format_seconds
from mule.mule_core.subwords import ngram_table
from mule.mule_core.vocabulary import PAD, UNK
from mule.tasks.shared import fasttext_worker
from mule.tasks.shared.context import StageContext, logger
from mule.tasks.shared.token_identity import caption_tokenizers


@contextlib.contextmanager
def heartbeat(label: str, every: float = 15.0):
    """Logs '<label>: still running, Ns' while a call that reports no progress of its own runs."""
    log, done, started = logger(), threading.Event(), time.perf_counter()

    def beat() -> None:
        while not done.wait(every):
            log.info("%s: still running, %s elapsed", label, format_seconds(time.perf_counter() - started), extra=SHOWN)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def fasttext_lookups(jobs: dict[str, dict[str, Any]], t, dim: int) -> dict[str, dict[str, Any]]:
    """fastText for each language of `jobs` (lang -> its language_vocabulary, with its
    n-gram table under "ngram_table", None without subwords), each in a
    process of its own (support/fasttext_worker.py: its vectors depend on its job alone),
    several at once when the cores allow (each keeps its vectors.fasttext_threads; `t`: the
    vectors section, `dim`: text.word_dim). Returns per language its words' vectors and its
    shared n-grams' rows."""

    def one(lang: str, words: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        vocab = [w for w in words["vocab"] if w not in (PAD, UNK)]
        grams = words["ngram_table"].ngrams if words["ngram_table"] is not None else []
        tokens = sum(len(s) for s in words["train"])
        logger().info("fastText %s (%s): %d sentences, %d tokens, %d epochs, %d thread(s)", t.fasttext_model, lang,
                      len(words["train"]), tokens, t.fasttext_epochs, t.fasttext_threads)  # fmt: skip
        # a stopped worker removes the folder itself (the stage may be gone by then)
        with tempfile.TemporaryDirectory(prefix=f"mule-fasttext-{lang}-", ignore_cleanup_errors=True) as scratch:
            directory = Path(scratch)
            fasttext_worker.write_job(directory, words["train"], vocab, grams, dim=dim, model=t.fasttext_model,
                                      epochs=t.fasttext_epochs, min_count=t.fasttext_min_count,
                                      threads=t.fasttext_threads, buckets=t.fasttext_buckets)  # fmt: skip
            with heartbeat(f"fastText ({lang}) on {tokens} tokens"):
                run_worker(directory, lang, workers)
            vectors = fasttext_worker.read_rows(directory, fasttext_worker.WORD_ROWS)
            rows = fasttext_worker.read_rows(directory, fasttext_worker.GRAM_ROWS)
        return {"vectors": dict(zip(vocab, vectors)), "ngrams": (list(grams), list(rows)),
                "seconds": time.perf_counter() - started}  # fmt: skip

    threads = max(1, t.fasttext_threads)
    most = max(1, min(len(jobs), devices.machine_cores() // threads))
    stopped = threading.Event()
    workers: set[subprocess.Popen] = set()  # the fastText processes running: a stop kills them

    def job(lang: str, words: dict[str, Any]) -> dict[str, Any] | None:
        return None if stopped.is_set() else one(lang, words)

    if most > 1:
        logger().info("fastText: %d languages, up to %d at a time", len(jobs), most, extra=SHOWN)
    pool = ThreadPoolExecutor(most, thread_name_prefix="fasttext")
    try:
        # the longest first (LPT; the pool starts them in this order): the last to start is
        # a short one, not German's 90 s on the real text
        futures = {lang: pool.submit(job, lang, jobs[lang]) for lang in longest_first(jobs)}
        # waited for in short turns: a stop raised again in the main thread (stopping.interrupts:
        # one a finaliser swallowed) is raised when it runs Python code, never inside an untimed wait
        while True:
            done, pending = wait(futures.values(), timeout=0.1, return_when=FIRST_EXCEPTION)
            if not pending or any(f.exception() is not None for f in done):
                break
        return {lang: futures[lang].result() for lang in jobs}
    except BaseException:  # a stop or an error: no job starts after it, and the stage does not wait for those running
        stopped.set()
        # their threads wait for their processes, and the interpreter's exit for the pool's
        # threads: the processes go now (a stop in the text stage took 3.6 s, past the grace)
        for worker in list(workers):
            worker.kill()
        raise
    finally:
        pool.shutdown(wait=not stopped.is_set(), cancel_futures=True)


def longest_first(jobs: dict[str, dict[str, Any]]) -> list[str]:
    """The languages by fastText's work on them, most first: the characters of their training
    text (each word is its character n-grams, so a token of a long word costs more: on the real
    text German's 1.9 M tokens took 90 s, English's 1.9 M 79 s, Czech's 0.3 M 19 s)."""
    work = {lang: sum(map(len, chain.from_iterable(words["train"]))) for lang, words in jobs.items()}
    return sorted(jobs, key=lambda lang: -work[lang])  # stable: equal work keeps the config's order


def run_worker(directory: Path, lang: str, running: set | None = None) -> None:
    """Runs fasttext_worker on `directory`; the worker is killed if this one is stopped.
    `running`: where the process is while it runs (the stage kills those on a stop)."""
    command = [sys.executable, "-m", "mule.tasks.shared.fasttext_worker", str(directory), str(os.getpid())]
    # fastText computes on its own threads; numpy's BLAS pool would only spin up at import (0.1 s a worker)
    env = os.environ | {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=env) as worker:  # fmt: skip
        if running is not None:
            running.add(worker)
        try:
            output, _ = worker.communicate()
        except BaseException:
            worker.kill()
            raise
        finally:
            if running is not None:
                running.discard(worker)
    if worker.returncode != 0:
        said = [line for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
        how = f"exit status {worker.returncode}"
        if worker.returncode < 0:  # SIGKILL: most often the kernel's out-of-memory killer (2.4 GB a model at 300-d)
            how = f"killed by {signal.Signals(-worker.returncode).name}"
        raise RuntimeError(f"fastText for {lang!r} failed ({how})" + (f": {said[-1]}" if said else ""))


def dataset_languages(catalog: Catalog, dataset: str, wanted: tuple[str, ...]) -> list[str]:
    present = set(catalog.languages(dataset))
    missing = [lang for lang in wanted if lang not in present]
    if missing:
        logger().warning(
            "dataset %s has no captions in %s; using %s", dataset, missing, [lang for lang in wanted if lang in present]
        )
    return [lang for lang in wanted if lang in present]


@bulk
def language_vocabulary(catalog: Catalog, dataset: str, lang: str, captions: str) -> dict[str, Any]:
    """A language's vocabulary (<pad>, <unk>, then the training captions' words by count)
    and the training captions fastText learns from.

    Only what training sees: a word of the validation or test captions alone gets no row
    (those are composed from their character n-grams, or <unk>, the same way wherever
    the model embeds a sentence: mule_core.vocabulary.Vocabulary.encode), so evaluation
    measures the model a user gets. `unseen` counts the other captions' words outside it."""
    rows = queries.captions_for_word_vectors(catalog, dataset, lang, captions)
    tokens, roles, selected = rows["tokens"].to_pylist(), rows["role"].to_pylist(), rows["selected"].to_pylist()
    train = [tk for tk, role, used in zip(tokens, roles, selected) if role == "train" and used]
    train_counts = Counter(w for tk in train for w in tk)
    unseen = {w for tk, role in zip(tokens, roles) if role != "train" for w in tk if w not in train_counts}
    vocab = [PAD, UNK, *sorted(train_counts, key=lambda w: (-train_counts[w], w))]
    return {"vocab": vocab, "train": train, "train_counts": train_counts, "unseen": unseen}


def subword_rows(table, vector) -> tuple[list[str], list[np.ndarray]]:
    """The n-grams two or more vocabulary words share (`table`, what model.subwords composes
    words from) with their vectors in the word-vector model (`vector(ngram)`, None: it has none)."""
    names, vectors = [], []
    for gram in table.ngrams:
        value = vector(gram)
        if value is not None:
            names.append(gram)
            vectors.append(np.asarray(value, np.float32))
    return names, vectors


def vector_column(vectors: list[np.ndarray]) -> pa.Array:
    """Equal-length float32 vectors as one list<float32> column, without a Python float each."""
    if not vectors:
        return pa.array([], pa.list_(pa.float32()))
    flat = np.ascontiguousarray(np.stack(vectors), dtype=np.float32)
    offsets = np.arange(0, flat.size + 1, flat.shape[1], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.reshape(-1)))


def multilingual_e5_lookups(vocabs: dict[str, list[str]], dim: int, tokenizers: dict[str, str]) -> dict[str, Any]:
    """word -> vector per language, from multilingual-e5 projected to `dim` (one shared
    projection: the languages stay aligned; words/projection.py)."""
    from mule.words.encoder import NAME
    from mule.words.projection import aligned_word_vectors

    words = {lang: [w for w in vocab if w not in (PAD, UNK)] for lang, vocab in vocabs.items()}
    logger().info("%s: %d words in %s, projected to %d dimensions", NAME, sum(map(len, words.values())),
                  ", ".join(words), dim, extra=SHOWN)  # fmt: skip
    vectors = aligned_word_vectors(words, dim, tokenizers, logger=logger())
    tables = {lang: dict(zip(words[lang], vectors[lang])) for lang in words}
    return {lang: table.get for lang, table in tables.items()}


def _source(lang: str, vocab: list[str], vectors, dim: int, e5_lookups: dict, fasttext: dict) -> tuple:
    """Where `lang`'s word vectors come from (`vectors`: the config's section; `dim`:
    text.word_dim): (origin, word -> vector or None, dim, and the n-gram vectors where a
    .vec file brings them, else None)."""
    if lang in vectors.files:
        source = VectorFile(vectors.files[lang], words=set(vocab))  # a .vec's other words are not kept
        return f"file:{source.path}", source.vector, source.dim, source.ngram_vector
    if lang in e5_lookups:
        from mule.words.encoder import encoder_version

        return f"multilingual-e5:{encoder_version()}:pca{dim}", e5_lookups[lang], dim, None
    return "fasttext:trained", fasttext[lang]["vectors"].get, dim, None


def _vectors_of(vocab: list[str], lookup, dim: int, rng: np.random.Generator) -> tuple[list[np.ndarray], int]:
    """A vector per word, row 0 (padding) zeros; <unk> and the words `lookup` lacks drawn
    from `rng`, counted."""
    vectors, missing = [np.zeros(dim, np.float32)], 0
    for word in vocab[1:]:
        vector = lookup(word) if word != UNK else None
        if vector is None:
            missing += word != UNK
            vector = rng.normal(0, 0.1, dim).astype(np.float32)  # <unk> and words a .vec file lacks
        vectors.append(np.asarray(vector, np.float32))
    return vectors, missing


def compute(ctx: StageContext) -> dict[str, Any]:
    catalog, cfg = ctx.catalog, ctx.cfg
    log, t, dataset = logger(), cfg.text, cfg.data.dataset
    languages = dataset_languages(catalog, dataset, cfg.data.languages)
    caption_tokenizers(catalog, dataset, languages, t.tokenizers, "text")  # the vocabulary is the tokens' words
    lengths = tuple(cfg.model.ngram_lengths) if cfg.model.subwords else ()
    columns: dict[str, list] = {
        name: [] for name in ("dataset", "lang", "index", "token", "train_count", "vector", "source")
    }
    grams: dict[str, list] = {name: [] for name in ("dataset", "lang", "ngram", "vector", "source")}
    summary: dict[str, Any] = {}
    dims = set()
    started = time.perf_counter()
    words = {lang: language_vocabulary(catalog, dataset, lang, cfg.data.captions) for lang in languages}
    v = cfg.vectors
    from_e5 = [lang for lang in languages if lang not in v.files] if v.init == "multilingual-e5" else []
    e5_lookups = multilingual_e5_lookups({lang: words[lang]["vocab"] for lang in from_e5}, t.word_dim,
                                         t.tokenizers) if from_e5 else {}  # fmt: skip
    trained = [lang for lang in languages if lang not in v.files and lang not in e5_lookups]
    captionless = [lang for lang in trained if not words[lang]["train"]]
    if captionless == languages:
        raise InputError(f"no training captions in {', '.join(map(repr, captionless))} to train word vectors on")
    if captionless:  # test captions alone (xFlickr&CO's): a language add-language reads zero-shot
        log.warning("no training captions in %s: no word vectors for it (`mule run add-language --lang %s` adds it to "
                    "a trained model, started aligned: no captions needed)", ", ".join(captionless), captionless[0],
                    extra=SHOWN)  # fmt: skip
        languages = [lang for lang in languages if lang not in captionless]
        trained = [lang for lang in trained if lang not in captionless]
    for lang in languages:  # built once: 2 s for the real German vocabulary
        words[lang]["ngram_table"] = ngram_table(words[lang]["vocab"], lengths) if lengths else None
    fasttext = fasttext_lookups({lang: words[lang] for lang in trained}, v, t.word_dim)
    started = time.perf_counter()
    for lang in languages:
        vocab, train_counts = words[lang]["vocab"], words[lang]["train_counts"]
        origin, lookup, dim, ngram_vector = _source(lang, vocab, v, t.word_dim, e5_lookups, fasttext)
        dims.add(dim)
        vectors, missing = _vectors_of(vocab, lookup, dim, np.random.default_rng([cfg.data.seed, len(lang)]))
        for index, (word, vector) in enumerate(zip(vocab, vectors)):
            for key, value in (("dataset", dataset), ("lang", lang), ("index", index), ("token", word),
                               ("train_count", train_counts.get(word, 0)), ("vector", vector), ("source", origin)):  # fmt: skip
                columns[key].append(value)
        trained_for = 0.0  # this language's fastText seconds (trained beside the others)
        if lang in fasttext:
            names, ngram_vectors = fasttext[lang]["ngrams"]
            trained_for = fasttext.pop(lang)["seconds"]
        else:
            table = words[lang]["ngram_table"]
            names, ngram_vectors = subword_rows(table, ngram_vector) if table is not None and ngram_vector else ([], [])
        for gram, vector in zip(names, ngram_vectors):
            for key, value in (("dataset", dataset), ("lang", lang), ("ngram", gram), ("vector", vector),
                               ("source", origin)):  # fmt: skip
                grams[key].append(value)
        unseen = words[lang]["unseen"]
        table = words[lang]["ngram_table"]
        composable = sum(1 for w in unseen if table.word_ids(w)) if table is not None else 0
        summary[lang] = {"vocab": len(vocab), "train_tokens": sum(train_counts.values()),
                         "unseen_in_train": len(unseen), "unseen_composed": composable,
                         "ngrams": len(table) if table is not None else 0, "ngram_vectors": len(names),
                         "without_vector": missing, "source": origin, "dim": dim,
                         "seconds": round(time.perf_counter() - started + trained_for, 1)}  # fmt: skip
        started = time.perf_counter()
        log.info("%s: %d words, vectors from %s; %d shared character n-grams (%d with the word-vector model's "
                 "vectors); %d words of the other splits are outside the vocabulary, %d of them composed from "
                 "n-grams, the rest <unk>; %.1fs", lang, len(vocab), origin, summary[lang]["ngrams"], len(names),
                 len(unseen), composable, summary[lang]["seconds"])  # fmt: skip
    if len(dims) > 1:
        raise InputError(f"word vectors of all languages must have one dimension, got {sorted(dims)}: {summary}")
    columns["vector"] = vector_column(columns["vector"])
    grams["vector"] = vector_column(grams["vector"])
    catalog.write_table("word_vectors", dataset, pa.table(columns))
    catalog.write_table("subword_vectors", dataset, pa.table(grams))
    return summary
