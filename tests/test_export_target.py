"""`mule export --out DIR` writes only where it may: an absent or empty folder, or an
earlier export holding nothing but mule's files; never the workdir or a folder inside it,
never `.` or a file; and a stop anywhere leaves the old export or the new one at the name."""

import hashlib
import os
import time
from pathlib import Path

import pytest
import torch

from mule.commands.main import main
from mule.config.resolution import resolve
from mule.data_catalog import exported_models
from mule.data_catalog.exported_models import ExportTargetError, is_model_folder, write_model_folder
from mule.data_catalog.model_files import save_model
from mule.mule_core.model import MuleModel
from mule.mule_core.vocabulary import Vocab, Vocabulary

WORDS = ["<pad>", "<unk>", "a", "red", "circle"]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    """A text-only model of five words, saved as the train stage saves one."""
    cfg = resolve("demo", {"text.word_dim": 2, "model.subwords": "false"})
    torch.manual_seed(0)
    vocabulary = Vocabulary(["en"], {"en": Vocab(WORDS)}, {"en": torch.randn(5, 2)})
    model = MuleModel(["en"], {"en": 5}, 2, None, cfg.model)
    path = tmp_path_factory.mktemp("model") / "model.pt"
    save_model(path, model, cfg, vocabulary, kind="joint", dataset="toy")
    return path


def export(model_file: Path, out: Path, workdir: Path | None = None) -> Path:
    return write_model_folder(out, model_file, "# a card\n", workdir=workdir)


def tree(folder: Path) -> dict[str, str]:
    """Every file under the folder and a digest of its bytes."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_a_folder_of_the_user_s_is_refused_and_left_as_it_was(model_file, tmp_path):
    thesis = tmp_path / "thesis"
    (thesis / "photos").mkdir(parents=True)
    (thesis / "thesis.tex").write_text("\\chapter{MULE}\n")
    (thesis / "photos" / "beach.jpg").write_bytes(b"\xff\xd8 a photo")
    before = tree(thesis)
    with pytest.raises(ExportTargetError, match=r"is not a mule export \(photos/, photos/beach.jpg, thesis.tex\)"):
        export(model_file, thesis)
    assert tree(thesis) == before and leftovers(tmp_path) == []


def test_an_absent_or_empty_folder_is_written_and_an_earlier_export_replaced(model_file, tmp_path):
    out = export(model_file, tmp_path / "absent")
    assert is_model_folder(out) and "vocab/en.txt" in tree(out)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert is_model_folder(export(model_file, empty))
    (out / "README.md").write_text("an old card\n")  # mule wrote it: an earlier export may be replaced whole
    export(model_file, out)
    assert (out / "README.md").read_text() == "# a card\n" and leftovers(tmp_path) == []


def test_an_earlier_export_with_a_file_of_the_user_s_inside_is_refused(model_file, tmp_path):
    out = export(model_file, tmp_path / "model")
    (out / "notes.md").write_text("what I found\n")
    (out / "vocab" / "extra.txt").write_text("mine\n")  # where mule writes, but not a file it wrote
    before = tree(out)
    with pytest.raises(ExportTargetError, match=r"an earlier export with files mule did not write \(notes.md, vocab/extra.txt\)"):
        export(model_file, out)
    assert tree(out) == before


def test_the_workdir_and_any_folder_inside_it_are_refused(model_file, tmp_path):
    workdir = tmp_path / "mule-work"
    (workdir / "models").mkdir(parents=True)
    (workdir / "mlflow.db").write_bytes(b"SQLite format 3\x00")
    before = tree(workdir)
    with pytest.raises(ExportTargetError, match="is the workdir"):
        export(model_file, workdir, workdir=workdir)
    for inside in (workdir / "models", workdir / "exports" / "new"):
        with pytest.raises(ExportTargetError, match="is inside the workdir"):
            export(model_file, inside, workdir=workdir)
    assert tree(workdir) == before and not (workdir / "exports").exists()


def test_the_command_refuses_dot_a_file_and_the_workdir_in_one_line(model_file, tmp_path, monkeypatch, capsys):
    """`--out .`, `--out FILE` and `--out` the workdir: exit 2, one line naming the folder,
    nothing written (no staging folder left beside it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MULE_HOME", raising=False)  # the default workdir: ./mule-work
    (tmp_path / "mule-work").mkdir()
    (tmp_path / "paper.pdf").write_bytes(b"%PDF-1.7")
    cases = {".": "is the folder you are in", "paper.pdf": "is a file, not a folder", "mule-work": "is the workdir",
             "..": "is the folder you are in (or one above it)"}  # fmt: skip
    for out, said in cases.items():
        assert main(["export", "--model-file", str(model_file), "--out", out]) == 2, out
        err = capsys.readouterr().err
        assert err.startswith("mule: error: ") and said in err and err.count("\n") == 1, err
    assert sorted(os.listdir(tmp_path)) == ["mule-work", "paper.pdf"] and (tmp_path / "paper.pdf").read_bytes() == b"%PDF-1.7"
    assert main(["export", "--model-file", str(model_file), "--out", "my-model", "--no-onnx"]) == 0
    assert is_model_folder(tmp_path / "my-model")


def test_a_stop_while_the_new_export_is_swapped_in_leaves_the_old_one_at_its_name(model_file, tmp_path, monkeypatch):
    """Ctrl-C as the new folder is renamed into place: the earlier export is at the name as
    it was, and nothing is left beside it; the next export replaces it."""
    out = export(model_file, tmp_path / "model")
    (out / "README.md").write_text("the old card\n")
    old = tree(out)
    real_rename = Path.rename

    def stopped(self, target):
        if self.name.endswith(".exporting"):
            raise KeyboardInterrupt
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", stopped)
    with pytest.raises(KeyboardInterrupt):
        export(model_file, out)
    monkeypatch.setattr(Path, "rename", real_rename)
    assert tree(out) == old and leftovers(tmp_path) == []
    export(model_file, out)
    assert (out / "README.md").read_text() == "# a card\n"


def test_an_export_killed_between_its_two_renames_is_put_back_by_the_next(model_file, tmp_path):
    """A kill -9 after the old export was renamed aside, before the new one was renamed in:
    the old one waits in .NAME.replaced, and the next export puts it back, then replaces it;
    a staging folder a killed export left is cleared (it holds only mule's files)."""
    out = export(model_file, tmp_path / "model")
    export(model_file, tmp_path / "staged")
    os.rename(out, tmp_path / ".model.replaced")  # where the kill left them
    os.rename(tmp_path / "staged", tmp_path / ".model.exporting")
    exported_models._put_back(out)
    assert is_model_folder(out) and leftovers(tmp_path) == [".model.exporting"]
    export(model_file, out)
    assert is_model_folder(out) and leftovers(tmp_path) == []


def test_a_folder_of_the_user_s_in_the_staging_name_is_never_deleted(model_file, tmp_path):
    mine = tmp_path / ".model.exporting"
    mine.mkdir()
    (mine / "diary.txt").write_text("mine\n")
    with pytest.raises(ExportTargetError, match="is in the way of the export and is not one mule left"):
        export(model_file, tmp_path / "model")
    assert (mine / "diary.txt").read_text() == "mine\n" and not (tmp_path / "model").exists()


def test_an_export_made_before_exports_listed_their_files_is_still_replaced(model_file, tmp_path):
    """Exports of earlier versions keep no list of their files: mule knows them by its layout."""
    import json

    out = export(model_file, tmp_path / "model")
    marker = json.loads((out / "mule_model.json").read_text())
    del marker["files"]
    (out / "mule_model.json").write_text(json.dumps(marker))
    assert exported_models.not_written_by_mule(out) == []
    (out / "thesis.tex").write_text("mine\n")
    assert exported_models.not_written_by_mule(out) == ["thesis.tex"]


EXPORT = """
import sys
from pathlib import Path
from mule.commands import console
console.setup("export", None)  # the console a command has: its warnings on stderr
from mule.data_catalog.exported_models import write_model_folder
write_model_folder(Path(sys.argv[2]), Path(sys.argv[1]), "# a card\\n")
print("exported", flush=True)
"""


def _start_export(model_file: Path, out: Path, log: Path):
    import subprocess
    import sys

    with open(log, "w") as handle:
        return subprocess.Popen([sys.executable, "-c", EXPORT, str(model_file), str(out)], stdout=handle,
                                stderr=subprocess.STDOUT)  # fmt: skip


@pytest.mark.slow
def test_a_second_export_to_the_same_folder_waits_for_the_first_saying_so(model_file, tmp_path):
    """Two `mule export --out SAME` at once shared one staging folder: one could rename the
    other's away mid-write (FileNotFoundError) or both said done over a mix. The second now
    says it waits, and writes once the first is done."""
    import time

    from mule.storage.locks import folder_lock

    out = tmp_path / "exports" / "model"
    out.parent.mkdir()
    with folder_lock(out.parent):  # an export in progress next to it
        second = _start_export(model_file, out, tmp_path / "second.log")
        deadline = time.monotonic() + 60
        while "waiting" not in (tmp_path / "second.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        assert second.poll() is None and not out.exists() and leftovers(out.parent) == []
    assert second.wait(60) == 0
    said = (tmp_path / "second.log").read_text()
    assert f"{out.parent} is being written by pid {os.getpid()} (`" in said and ": waiting for it to finish" in said
    assert is_model_folder(out) and "exported" in said and leftovers(out.parent) == []


@pytest.mark.slow
def test_a_folder_another_writer_holds_is_refused_naming_it_unless_told_to_wait(model_file, tmp_path):
    """`mule export` next to a folder another process writes (here: this test's) refuses in
    one line naming the holder (pid, command, since when) and what to do, as the workdir's
    lock does; with --wait it waits, saying whom for."""
    import subprocess
    import sys

    from mule.storage.locks import folder_lock

    out = tmp_path / "exports" / "model"
    out.parent.mkdir()
    command = [sys.executable, "-m", "mule.commands", "export", "--model-file", str(model_file), "--out", str(out),
               "--no-onnx"]  # fmt: skip
    with folder_lock(out.parent):
        refused = subprocess.run(command, capture_output=True, text=True, timeout=300)
        with open(tmp_path / "waiting.log", "w") as log:
            waiting = subprocess.Popen([*command, "--wait"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while "waiting for it" not in (tmp_path / "waiting.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert waiting.poll() is None and not out.exists()
    assert refused.returncode == 2 and not out.exists(), refused.stderr[-2000:]
    assert f"{out.parent} is being written by pid {os.getpid()} (`" in refused.stderr
    assert "run this again when it is done, or with --wait to wait for it" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert waiting.wait(300) == 0 and is_model_folder(out)


@pytest.mark.slow
def test_two_exports_to_the_same_folder_at_once_both_finish_with_one_whole_export(model_file, tmp_path):
    reference = export(model_file, tmp_path / "reference")
    for attempt in range(3):
        out = tmp_path / f"try-{attempt}" / "model"
        out.parent.mkdir()
        runs = [_start_export(model_file, out, tmp_path / f"{attempt}-{n}.log") for n in range(2)]
        assert [run.wait(120) for run in runs] == [0, 0], [(tmp_path / f"{attempt}-{n}.log").read_text()[-2000:]
                                                          for n in range(2)]  # fmt: skip
        assert tree(out) == tree(reference) and leftovers(out.parent) == []
