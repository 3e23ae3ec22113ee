
"""The MULE model: shapes, per-language routing, normalisation, parameter counts."""

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from mule.config.resolution import resolve
from mule.mule_core.model import MuleModel, TextBatch, count_parameters, unrolled_lstm_last
from mule.mule_core.settings import ModelConfig

# One vector per word: the counts below are by hand (subword n-grams: test_subwords.py)
CFG = ModelConfig(mule_dim=6, lstm_dim=5, joint_dim=4, image_hidden=7, subwords=False)


def tiny_model(image_dim=3):
    torch.manual_seed(0)
    return MuleModel(["en", "fr"], {"en": 10, "fr": 8}, word_dim=2, image_dim=image_dim, cfg=CFG)


def test_parameter_counts_by_hand():
    counts = count_parameters(tiny_model())
    en = 10 * 2 + (2 * 6 + 6)  # embeddings + MULE FC
    fr = 8 * 2 + (2 * 6 + 6)
    lstm = 4 * 5 * (6 + 5) + 2 * 4 * 5  # 4 gates x (input + hidden weights) + two biases
    text_fc = 5 * 4 + 4
    image = (3 * 7 + 7) + 2 * 7 + (7 * 4 + 4)  # FC, batch norm (weight, bias), FC
    classifier = 6 * 2 + 2
    assert counts["per_language"] == {"en": en, "fr": fr}
    assert counts["language_specific"] == en + fr
    assert counts["shared"] == lstm + text_fc + image + classifier
    assert counts["total"] == en + fr + lstm + text_fc + image + classifier


def test_paper_model_parameter_count():
    cfg = resolve("paper")
    vocab = {"en": 20000, "de": 25000, "fr": 12000, "cs": 15000}
    model = MuleModel(list(vocab), vocab, 300, 2048, cfg.model)
    counts = count_parameters(model)
    per_lang = {lang: v * 300 + 300 * 512 + 512 for lang, v in vocab.items()}
    lstm = 4 * 1024 * (512 + 1024) + 2 * 4 * 1024
    shared = lstm + (1024 * 512 + 512) + (2048 * 2048 + 2048 + 2 * 2048 + 2048 * 512 + 512) + (512 * 4 + 4)
    assert counts["per_language"] == per_lang
    assert counts["shared"] == shared == 12_076_036  # LSTM 6,299,648 + FC 524,800 + image 5,249,536 + LC 2,052
    assert counts["total"] == shared + sum(per_lang.values())


def test_sentences_are_routed_to_their_language_branch():
    model = tiny_model()
    tokens = torch.tensor([[2, 3, 0], [4, 0, 0], [2, 3, 0]])
    batch = TextBatch(tokens, torch.tensor([2, 1, 2]), [("en", 0, 2), ("fr", 2, 3)])
    words = model.mule_words(batch)
    assert torch.allclose(words[0], model.branches["en"](tokens[0]))
    assert torch.allclose(words[2], model.branches["fr"](tokens[2]))
    assert not torch.allclose(words[0], words[2])  # same ids, other language, other vectors
    en = model.branches["en"]  # the FC runs once per distinct word: the same as on every token
    torch.testing.assert_close(en(tokens), en.fc(en.word_vectors(tokens)))


def test_encodings_are_normalised_and_the_mule_vector_is_the_mean_of_words():
    model = tiny_model().eval()
    batch = TextBatch(torch.tensor([[2, 3, 0], [4, 0, 0]]), torch.tensor([2, 1]), [("en", 0, 2)])
    encoded = model.encode_text(batch)
    words = model.branches["en"](batch.tokens)
    assert torch.allclose(encoded.mule[0], words[0, :2].mean(0), atol=1e-6)  # padding excluded
    assert torch.allclose(encoded.joint.norm(dim=1), torch.ones(2))
    model.set_image_normalization(torch.randn(16, 3))
    assert torch.allclose(model.encode_image(torch.randn(5, 3)).norm(dim=1), torch.ones(5))


def test_word_drift_is_zero_at_the_initial_vectors():
    model = tiny_model()
    model.branches["en"].init_vectors(torch.randn(10, 2))
    model.branches["fr"].init_vectors(torch.randn(8, 2))
    assert model.word_drift().item() == 0.0
    with torch.no_grad():
        model.branches["en"].embed.weight[3] += 1.0
    assert model.word_drift().item() == 2.0  # two dimensions moved by 1


def test_text_only_model_has_no_image_branch():
    model = tiny_model(image_dim=None)
    assert model.image_branch is None


def test_parallel_and_embn_parameter_counts_by_hand():
    cfg = ModelConfig(sharing="parallel", mule_dim=6, lstm_dim=5, joint_dim=4, image_hidden=7, subwords=False)
    encoder = 4 * 5 * (2 + 5) + 2 * 4 * 5 + (5 * 4 + 4)  # an LSTM on 2-d word vectors, then FC
    image = (3 * 7 + 7) + 2 * 7 + (7 * 4 + 4)
    parallel = count_parameters(MuleModel(["en", "fr"], {"en": 10, "fr": 8}, 2, 3, cfg))
    assert parallel["per_language"] == {"en": 10 * 2 + encoder, "fr": 8 * 2 + encoder}
    assert parallel["shared"] == image  # only the image branch; no MULE layer, no classifier
    embn_fr = count_parameters(MuleModel(["fr"], {"fr": 8}, 2, 3, cfg))
    assert embn_fr["total"] == 8 * 2 + encoder + image
    # Four EmbN models cost four image branches; PARALLEL shares one; MULE shares the encoder too.
    mule = count_parameters(tiny_model())
    assert (
        mule["total"]
        < parallel["total"]
        < count_parameters(MuleModel(["en"], {"en": 10}, 2, 3, cfg))["total"] + embn_fr["total"]
    )


def test_parallel_model_routes_each_language_through_its_own_encoder():
    cfg = ModelConfig(sharing="parallel", mule_dim=6, lstm_dim=5, joint_dim=4, image_hidden=7, subwords=False)
    torch.manual_seed(0)
    model = MuleModel(["en", "fr"], {"en": 10, "fr": 8}, 2, 3, cfg).eval()
    tokens = torch.tensor([[2, 3], [2, 3]])
    encoded = model.encode_text(TextBatch(tokens, torch.tensor([2, 2]), [("en", 0, 1), ("fr", 1, 2)]))
    assert encoded.mule is None and encoded.joint.shape == (2, 4)
    assert not torch.allclose(encoded.joint[0], encoded.joint[1])
    assert not model.has_mule and model.mule_parameters() == []


def test_unrolled_lstm_matches_pytorchs_lstm_in_values_and_gradients():
    """Training on the CPU runs the LSTM step by step; it must be PyTorch's LSTM exactly."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(6, 5, batch_first=True)
    words = torch.randn(7, 9, 6)
    lengths = torch.tensor([9, 1, 4, 9, 2, 7, 3])  # unsorted, ties, a one-word sentence

    def run(encode):
        lstm.zero_grad()
        x = words.clone().requires_grad_(True)
        out = encode(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        (out * torch.arange(35.0).reshape(7, 5)).sum().backward()
        return out.detach(), x.grad, [p.grad.clone() for p in lstm.parameters()]

    reference = run(lambda packed: lstm(packed)[1][0][-1])
    unrolled = run(lambda packed: unrolled_lstm_last(lstm, packed))
    torch.testing.assert_close(unrolled[0], reference[0])
    torch.testing.assert_close(unrolled[1], reference[1])
    for got, want in zip(unrolled[2], reference[2], strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.slow
def test_an_untrained_model_needs_the_model_library_alone():
    """create_model builds a model from settings and vocabularies, with nothing of mule
    outside mule_core imported (open_clip's model code needs nothing of its training app)."""
    import json
    import subprocess
    import sys

    code = ("import sys, json, torch; from mule.mule_core import ModelConfig, Vocab, create_model; "
            "m = create_model(ModelConfig(), {'en': Vocab.build([['a', 'dog']]), 'de': Vocab.build([['ein', 'hund']])}, "
            "image_dim=16, word_dim=8); "
            "print(json.dumps([m.languages, sorted({k.split('.')[1] for k in sys.modules if k.startswith('mule.')})]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    languages, rooms = json.loads(done.stdout.strip().splitlines()[-1])
    assert languages == ["en", "de"] and rooms == ["mule_core"], rooms
