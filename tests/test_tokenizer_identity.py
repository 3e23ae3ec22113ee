"""One tokeniser from ingest to serving: the identity of each language's tokeniser (rule,
library, version) is stored with the captions and carried by the model; a query is split
by it, exactly as the stored captions were; a changed text.tokenizers runs ingest again
before any stage uses the tokens; a library that changed since training is said."""

from __future__ import annotations

import csv
from dataclasses import replace

import pytest
import torch
from PIL import Image

from mule.config.resolution import resolve
from mule.data_catalog.tables import Catalog
from mule.mule_core.embedder import Embedder
from mule.mule_core.vocabulary import Vocab, Vocabulary
from mule.pipeline import rebuild
from mule.pipeline.runner import run_alone
from mule.storage.workdir import Workdir

# One caption per language, with what splits words differently: clitics and contractions
# (Moses), no spaces (janome, jieba, Thai's graphemes), mixed scripts and full-width digits.
CAPTIONS = {
    "en": "The dog's ball isn't red; it's Ｂlue—and 2.5 m wide!",
    "de": "Der Hund läuft über die Straße, z.B. schnell.",
    "ja": "二人の男性がテーブルでピザを食べている。",
    "zh": "两个男人在桌子上吃披萨。",
    "th": "สุนัขวิ่งในสวนสาธารณะ",
    "sw": "Mbwa anakimbia, kwenye bustani ya watoto.",
}


def _dataset(root):
    (root / "photos").mkdir(parents=True)
    with open(root / "captions.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(("file_name", "caption", "lang", "split"))
        for n in range(6):
            Image.new("RGB", (8, 8), (40 * n, 9, 9)).save(root / "photos" / f"{n}.png")
            for lang, text in CAPTIONS.items():
                writer.writerow((f"photos/{n}.png", f"{text} {n}", lang, ("train", "val", "test")[n % 3]))
    return root


def _served_tokens(catalog: Catalog, dataset: str, identities: dict[str, str]) -> list[tuple[str, list, list]]:
    """(lang, stored tokens, the tokens a model trained on them serves) of every caption."""
    rows = catalog.read_table("captions", dataset).to_pylist()
    vocabs = {lang: Vocab.build(r["tokens"] for r in rows if r["lang"] == lang) for lang in CAPTIONS}
    cfg = resolve("demo")
    embedder = Embedder(torch.nn.Module(), {"vocabulary": Vocabulary(list(CAPTIONS), vocabs), "cfg": cfg,
                                            "tokenizers": identities}, "test model")  # fmt: skip
    return [(r["lang"], r["tokens"], embedder._prepare(r["text"], r["lang"])[2]) for r in rows]


@pytest.mark.parametrize("overrides", [{}, {"en": "unicode", "de": "unicode", "th": "moses", "sw": "moses"}],
                         ids=["the rule", "overridden"])  # fmt: skip
def test_a_served_caption_has_the_tokens_it_was_stored_with_in_every_language_and_tokeniser(tmp_path, overrides):
    source = _dataset(tmp_path / "data")
    wd = Workdir.at(tmp_path / "work")
    settings = {"data.dataset": "mine", "data.source": str(source), "data.languages": ",".join(CAPTIONS)}
    if overrides:
        settings["text.tokenizers"] = ",".join(f"{k}={v}" for k, v in overrides.items())
    cfg = resolve(None, settings)
    summary = run_alone(wd, cfg, "ingest")
    catalog = Catalog(wd)
    identities = catalog.table_notes("captions", "mine")["tokenizers"]
    assert identities == summary["tokenizers"]
    kinds = {lang: identity.split()[0] for lang, identity in identities.items()}
    expected = {"en": "moses", "de": "moses", "ja": "janome", "zh": "jieba", "th": "unicode", "sw": "unicode"}
    assert kinds == expected | overrides
    assert all("==" in identity for identity in identities.values())  # the library and its version
    served = _served_tokens(catalog, "mine", identities)
    assert len(served) == 6 * len(CAPTIONS)
    for lang, stored, tokens in served:
        assert tokens == stored, lang


def test_a_changed_tokenizer_runs_ingest_again_before_the_stages_that_use_the_tokens(tmp_path):
    from mule.tasks.shared.token_identity import TokenizerChangedError

    source = _dataset(tmp_path / "data")
    wd = Workdir.at(tmp_path / "work")
    settings = {"data.dataset": "mine", "data.source": str(source), "data.languages": "en,de"}
    cfg = resolve(None, settings)
    run_alone(wd, cfg, "ingest")
    assert rebuild.plan(wd, cfg, ["train"]).stages == ["train"]
    changed = replace(cfg, text=replace(cfg.text, tokenizers={"en": "unicode"}))
    planned = rebuild.plan(wd, changed, ["train"]).stages
    assert planned[0] == "ingest" and {"text", "pretrain", "train"} <= set(planned)
    with pytest.raises(TokenizerChangedError, match=r"en: moses -> unicode"):
        run_alone(wd, changed, "text")  # run alone, a stage refuses the other tokeniser's tokens


def test_a_library_that_changed_since_training_is_said_when_the_model_is_opened():
    vocab = Vocab.build([["a", "dog"]])
    identities = {"en": "moses sacremoses==0.0.1 lower-nfkc-1"}
    embedder = Embedder(torch.nn.Module(), {"vocabulary": Vocabulary(["en"], {"en": vocab}), "cfg": resolve("demo"),
                                            "tokenizers": identities}, "old model")  # fmt: skip
    (trained, installed), = embedder.tokenizer_drift().values()
    assert trained == identities["en"] and installed.startswith("moses sacremoses==") and installed != trained
    assert embedder.tokenizers == {"en": "moses"}
