"""Word vectors: fastText trained on captions, or read from .vec files."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from mule.datasets.vector_files import VectorFile, VectorFileError
from mule.mule_core.subwords import ngram_table
from mule.tasks import text
from mule.tasks.shared import fasttext_worker


def test_fasttext_learns_vectors_for_corpus_words_and_unseen_words(tmp_path):
    """In a fresh process, as the text stage fits it: fasttext-numpy2 leaves nine tenths of
    its input matrix uninitialised on one thread (an aligned buffer, not zeroed), so in a
    process whose heap has been used its rows can start as garbage (a NaN, once)."""
    import subprocess
    import sys

    (tmp_path / "corpus.txt").write_text("a red circle\na blue square\na red square\n" * 50, encoding="utf-8")
    check = f"""
import numpy as np
from pathlib import Path
from mule.tasks.shared import fasttext_worker
model = fasttext_worker.fit(Path({str(tmp_path / "corpus.txt")!r}), dim=8, model="skipgram", epochs=5, min_count=1,
                            threads=1)
print(model.get_word_vector("red").shape[0], float(np.abs(model.get_word_vector("circles")).sum()))
"""
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    dim, unseen = done.stdout.split()
    assert int(dim) == 8 and float(unseen) > 0  # "circles": built from subwords


def test_the_bucket_count_is_the_number_of_hashed_ngram_rows_fasttext_makes(tmp_path):
    """vectors.fasttext_buckets reaches fastText: its input matrix is a row per word and one per
    bucket (fastText's 2,000,000 by default), and an n-gram's row is one of the buckets."""
    (tmp_path / "corpus.txt").write_text("a red circle\na blue square\na red square\n" * 20, encoding="utf-8")
    settings = {"dim": 4, "model": "skipgram", "epochs": 1, "min_count": 1, "threads": 1}
    small = fasttext_worker.fit(tmp_path / "corpus.txt", **settings, buckets=1000)
    assert small.get_input_matrix().shape == (len(small.words) + 1000, 4)
    assert len(small.words) <= small.get_subword_id("<re") < len(small.words) + 1000
    default = fasttext_worker.fit(tmp_path / "corpus.txt", **settings)
    assert default.get_input_matrix().shape[0] == len(default.words) + 2_000_000


@pytest.mark.slow
def test_languages_trained_side_by_side_get_the_vectors_of_a_run_alone(monkeypatch):
    """The text stage trains several languages' fastText at once when it has the cores, each
    in a process of its own with its own thread count, so its vectors and n-gram rows are
    bit for bit those of one language at a time (and those of the run before)."""
    from types import SimpleNamespace

    settings = SimpleNamespace(fasttext_model="skipgram", fasttext_epochs=3, fasttext_min_count=1,
                               fasttext_threads=1, fasttext_buckets=100_000)  # fmt: skip
    jobs = {}
    for lang, words in (("en", ["a", "red", "reds", "circles", "circle"]), ("de", ["ein", "roter", "rotes", "kreis", "kreise"])):
        train = [[words[0], words[i % 4 + 1], words[(i * 7) % 4 + 1]] for i in range(300)]
        vocab = ["<pad>", "<unk>", *words]
        jobs[lang] = {"train": train, "vocab": vocab, "ngram_table": ngram_table(vocab, (3, 4))}
    results, started = [], []
    run_worker = text.run_worker
    monkeypatch.setattr(text, "run_worker", lambda directory, lang, *rest: started.append(lang) or run_worker(directory, lang, *rest))
    for cores in (1, 4, 4):
        monkeypatch.setattr(text.devices, "usable_cores", lambda cores=cores: cores)
        monkeypatch.setattr(text.devices, "machine_cores", lambda cores=cores: cores)  # what the stage's gate reads
        results.append(text.fasttext_lookups(jobs, settings, 8))
    alone, together, again = results
    # one at a time, the most characters first (German's "ein" against English's "a"); the results in the config's order
    assert started[:2] == ["de", "en"] and list(alone) == ["en", "de"]
    assert all(np.array_equal(a, b) for a, b in zip(together["en"]["ngrams"][1], again["en"]["ngrams"][1]))
    for lang in jobs:
        assert alone[lang]["vectors"].keys() == together[lang]["vectors"].keys() == set(jobs[lang]["vocab"][2:])
        for word, vector in alone[lang]["vectors"].items():
            assert np.array_equal(vector, together[lang]["vectors"][word])
        assert alone[lang]["ngrams"][0] == together[lang]["ngrams"][0] != []
        assert all(np.array_equal(a, b) for a, b in zip(alone[lang]["ngrams"][1], together[lang]["ngrams"][1]))


def test_fasttext_s_longest_jobs_start_first():
    """Longest processing time first: on two cores the short languages fill in at the end,
    and no long one starts last (a token costs by its characters: its n-grams)."""
    jobs = {"en": {"train": [["a", "dog"]] * 3}, "de": {"train": [["ein", "schäferhund"]] * 2},
            "fr": {"train": [["un"]]}, "cs": {"train": [["pes"]]}}  # fmt: skip
    assert text.longest_first(jobs) == ["de", "en", "cs", "fr"]
    assert text.longest_first({"en": {"train": [["ab"]]}, "de": {"train": [["a", "b"]]}}) == ["en", "de"]  # ties: as given


def fasttext_job(directory, sentences, epochs=3):
    fasttext_worker.write_job(directory, sentences, ["a"], ["<a>"], dim=8, model="skipgram", epochs=epochs,
                              min_count=1, threads=1)  # fmt: skip


def test_a_failed_fasttext_names_the_language_and_says_why(tmp_path):
    fasttext_job(tmp_path, [])  # nothing to learn from
    with pytest.raises(RuntimeError, match=r"^fastText for 'de' failed \(exit status 1\): ValueError: Empty vocabulary"):
        text.run_worker(tmp_path, "de")


def long_fasttext_job(directory):
    directory.mkdir()
    words = [[f"w{i}", f"w{i + 1}", f"w{i + 2}"] for i in range(1000)]  # all rare: none is sampled away
    fasttext_job(directory, words, epochs=100_000)  # minutes of training
    return f"{sys.executable} -m mule.tasks.shared.fasttext_worker {directory}"


@pytest.mark.slow
def test_a_fasttext_worker_ends_when_the_stage_that_started_it_is_gone(tmp_path):
    """A stage killed at once (SIGKILL, out of memory) cannot stop its workers: they stop
    themselves, also in the middle of fastText's training, and take their job folder."""
    worker = long_fasttext_job(tmp_path / "job")
    stage = subprocess.Popen(["bash", "-c", f"{worker} $$ & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    pid = int(stage.stdout.readline())
    time.sleep(1)  # fastText is training now (it starts within 0.5 s)
    assert running(pid)
    stage.kill()
    stage.wait()
    deadline = time.monotonic() + 10
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(pid) and not (tmp_path / "job").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.slow
def test_a_fasttext_worker_stops_at_once_on_ctrl_c_or_sigterm(tmp_path, signum):
    """Ctrl-C reaches the whole process group: the worker ends within a second, in the
    middle of fastText's training, and leaves no job folder behind."""
    worker = subprocess.Popen([*long_fasttext_job(tmp_path / "job").split(), str(os.getpid())])
    time.sleep(1)  # fastText is training now (it starts within 0.5 s)
    assert worker.poll() is None
    sent = time.monotonic()
    worker.send_signal(signum)
    assert worker.wait(timeout=10) == 128 + signum and time.monotonic() - sent < 1.5
    assert not (tmp_path / "job").exists()


def test_a_worker_the_kernel_kills_is_named_with_its_signal(tmp_path):
    """The out-of-memory killer's SIGKILL (2.4 GB a model at 300-d) says so, not `exit status -9`."""
    import threading

    job = tmp_path / "job"
    long_fasttext_job(job)
    failure = []
    stage = threading.Thread(target=lambda: failure.append(pytest.raises(RuntimeError, text.run_worker, job, "cs")))
    stage.start()
    deadline = time.monotonic() + 10
    while not (workers := [c for c in psutil.Process().children() if str(job) in " ".join(c.cmdline())]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    workers[0].send_signal(signal.SIGKILL)
    stage.join(10)
    assert str(failure[0].value) == "fastText for 'cs' failed (killed by SIGKILL)"


def running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap an orphan)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_vec_file(tmp_path):
    path = tmp_path / "tiny.vec"
    path.write_text("2 3\nred 1 0 0\nblue 0 1 0.5\n", encoding="utf-8")
    vectors = VectorFile(path)
    assert vectors.dim == 3
    assert vectors.vector("blue").tolist() == [0.0, 1.0, 0.5]
    assert vectors.vector("green") is None


def test_bad_vec_file_names_the_line(tmp_path):
    path = tmp_path / "bad.vec"
    path.write_text("2 3\nred 1 0 0\nblue 0 1\n", encoding="utf-8")
    with pytest.raises(VectorFileError, match="bad.vec:3: expected a word and 3 numbers, got 2"):
        VectorFile(path)


def test_a_vec_file_is_streamed_keeping_only_the_words_asked_for(tmp_path):
    """fastText's cc.<lang>.300.vec is 2M words for a vocabulary of thousands: only the
    vocabulary's lines are parsed and kept (trailing spaces, as fastText writes, are fine);
    a wanted word's bad line is still named by its line."""
    path = tmp_path / "cc.de.300.vec"
    path.write_text("4 2\nrot 0.1 0.2 \nblau 0.3 0.4 \nschön 1 2\nkreis 0.5 0.6\n", encoding="utf-8")
    vectors = VectorFile(path, words={"rot", "schön", "quadrat"})
    assert vectors.dim == 2 and vectors.lines == 5 and set(vectors._table) == {"rot", "schön"}
    assert vectors.vector("schön").tolist() == [1.0, 2.0] and vectors.vector("blau") is None
    path.write_text("2 2\nrot 0.1 zwei\nblau 0.3\n", encoding="utf-8")
    assert VectorFile(path, words={"kreis"}).vector("rot") is None  # lines of other words are not parsed
    with pytest.raises(VectorFileError, match=r"cc.de.300.vec:2: 'rot' has a value that is not a number"):
        VectorFile(path, words={"rot"})
    with pytest.raises(VectorFileError, match=r"cc.de.300.vec:3: expected a word and 2 numbers, got 1"):
        VectorFile(path, words={"blau"})


def test_missing_vector_file(tmp_path):
    with pytest.raises(VectorFileError, match="does not exist"):
        VectorFile(tmp_path / "cc.en.300.bin")
