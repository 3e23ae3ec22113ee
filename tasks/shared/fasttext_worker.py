"""One language's fastText, trained in a process of its own: `python -m
mule.tasks.shared.fasttext_worker JOB_DIR`.

Why a process: a model's vectors then depend on its job alone. Trained inside the stage's
process (one model at a time, or several side by side on threads), the same job gave
vectors that differed in the third digit now and then (2 of 5 suite runs, cause not
found in fastText's code); in a fresh process they are the same at any parallelism. It
also keeps the model's input matrix (2.4 GB at 300-d) out of the stage's memory.

JOB_DIR holds job.json (the fastText settings), train.txt (one tokenised sentence a
line), words.txt and grams.txt (one entry a line: what to read back). The worker writes
words.npy (a row per word) and grams.npy (a row per n-gram). It imports only numpy and
fasttext, and ends, taking JOB_DIR with it, on Ctrl-C or SIGTERM or when its parent is gone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from mule.storage.atomic import write_atomic

if TYPE_CHECKING:
    import numpy as np

JOB, TRAIN, WORDS, GRAMS = "job.json", "train.txt", "words.txt", "grams.txt"
WORD_ROWS, GRAM_ROWS = "words.npy", "grams.npy"


def write_job(directory: Path, sentences: list[list[str]], words: list[str], grams: list[str], **settings) -> None:
    """The files a worker reads (settings: dim, model, epochs, min_count, threads, buckets)."""
    (directory / JOB).write_text(json.dumps(settings), encoding="utf-8")
    (directory / TRAIN).write_text("\n".join(" ".join(tokens) for tokens in sentences), encoding="utf-8")
    for name, entries in ((WORDS, words), (GRAMS, grams)):
        (directory / name).write_text("".join(f"{entry}\n" for entry in entries), encoding="utf-8")


def read_rows(directory: Path, name: str) -> np.ndarray:
    import numpy as np

    return np.load(directory / name, allow_pickle=False)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def fit(train_file: Path, dim: int, model: str, epochs: int, min_count: int, threads: int, buckets: int | None = None):
    """fastText on a file of tokenised sentences (with one thread, fastText seeds itself);
    `buckets` None: fastText's own count."""
    import fasttext

    count = {} if buckets is None else {"bucket": buckets}
    return fasttext.train_unsupervised(str(train_file), model=model, dim=dim, epoch=epochs, minCount=min_count,
                                       thread=threads, verbose=0, **count)  # fmt: skip


def ngram_row(model, gram: str) -> np.ndarray:
    """An n-gram's own row in the model's input matrix (the rows fastText averages into a
    word's vector)."""
    return model.get_input_vector(model.get_subword_id(gram))


def train(directory: Path) -> None:
    import numpy as np

    settings = json.loads((directory / JOB).read_text(encoding="utf-8"))
    model = fit(directory / TRAIN, **settings)
    words = [model.get_word_vector(w) for w in lines(directory / WORDS)]
    grams = [ngram_row(model, g) for g in lines(directory / GRAMS)]
    for name, rows in ((WORD_ROWS, words), (GRAM_ROWS, grams)):
        table = np.stack(rows).astype(np.float32) if rows else np.zeros((0, settings["dim"]), np.float32)
        write_atomic(directory / name, lambda tmp, table=table: _save(tmp, table), crash_point=False)


def _save(tmp: Path, table) -> None:
    import numpy as np

    with open(tmp, "wb") as handle:  # a handle: np.save would add .npy to the temporary's name
        np.save(handle, table)


STOPS = {signal.SIGINT, signal.SIGTERM}


def watch(directory: Path, parent: int) -> None:
    """Ends this worker, and removes its job folder (a real language's sentences, tens of
    MB), when a stop signal comes (Ctrl-C reaches the whole process group) or once
    `parent` is gone (a stage killed at once cannot stop its workers): at once, not when
    fastText next returns to Python. The signals are blocked in every other thread, so
    they wait here."""
    while True:
        stop = signal.sigtimedwait(STOPS, 0.5)
        if stop is not None or os.getppid() != parent:
            shutil.rmtree(directory, ignore_errors=True)
            os._exit(128 + stop.si_signo if stop is not None else 1)


if __name__ == "__main__":
    job, parent = Path(sys.argv[1]), int(sys.argv[2])
    # before any thread starts (numpy's BLAS pool starts at its import): every thread inherits the mask
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    threading.Thread(target=watch, args=(job, parent), daemon=True).start()
    train(job)
