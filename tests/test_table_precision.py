"""How a model's word and n-gram tables are stored (output.tables): float16 or int8 with
one scale a row, and a file that loads as the very model that was measured."""

import pytest
import torch

from mule.mule_core.table_precision import SCALE_SUFFIX, int8_rows, loaded_tables, rounded, stored_tables


def test_an_int8_row_is_scaled_by_its_largest_value_and_rounded_to_the_nearest_step():
    table = torch.tensor([[1.27, -0.635, 0.0, 0.004], [0.0, 0.0, 0.0, 0.0], [-2.54, 1.0, 0.011, 2.54]])
    values, scale = int8_rows(table)
    assert values.dtype == torch.int8 and scale.dtype == torch.float32
    assert scale.tolist() == pytest.approx([0.01, 1.0, 0.02])  # a row of zeros: scale 1, nothing divided by 0
    assert values.tolist() == [[127, -64, 0, 0], [0, 0, 0, 0], [-127, 50, 1, 127]]  # -63.5 -> -64, 0.4 -> 0, 0.55 -> 1
    back = rounded(table, "int8")
    assert torch.equal(back, values.float() * scale[:, None])
    # at most half a step from the value: 1/254 of the row's largest
    assert ((back - table).abs() <= scale[:, None] / 2 + 1e-7).all()


def test_an_int8_table_stored_again_after_it_loaded_keeps_its_bytes():
    """A language added to an int8 model stores the base's tables again: they must not move."""
    torch.manual_seed(1)
    table = torch.randn(20_000, 16) * torch.logspace(-6, 2, 20_000)[:, None]
    values, scale = int8_rows(table)
    again_values, again_scale = int8_rows(values.float() * scale[:, None])
    assert torch.equal(again_values, values) and torch.equal(again_scale, scale)


def test_float16_and_float32_round_as_their_types_do():
    table = torch.tensor([[1 / 3, 1e-3]])
    assert torch.equal(rounded(table, "float16"), table.half().float())
    assert torch.equal(rounded(table, "float32"), table)


def test_a_stored_state_holds_int8_tables_with_their_scales_and_loads_bit_for_bit_as_rounded():
    torch.manual_seed(0)
    state = {"branches.en.embed.weight": torch.randn(50, 8), "branches.de.embed.weight": torch.randn(30, 8),
             "branches.en.fc.weight": torch.randn(4, 8)}  # fmt: skip
    stored = stored_tables(state, {"branches.en.embed.weight": "int8", "branches.de.embed.weight": "float16"})
    assert stored["branches.en.embed.weight"].dtype == torch.int8
    assert stored["branches.en.embed.weight" + SCALE_SUFFIX].shape == (50,)
    assert stored["branches.de.embed.weight"].dtype == torch.float16
    assert stored["branches.en.fc.weight"] is state["branches.en.fc.weight"]
    loaded = loaded_tables(stored)
    assert set(loaded) == set(state)  # the scales are not weights
    assert torch.equal(loaded["branches.en.embed.weight"], rounded(state["branches.en.embed.weight"], "int8"))
    assert torch.equal(loaded["branches.de.embed.weight"], rounded(state["branches.de.embed.weight"], "float16"))
    # a quarter of the float32 bytes, and a float32 scale a row
    bytes_of = {k: v.numel() * v.element_size() for k, v in stored.items()}
    assert bytes_of["branches.en.embed.weight"] + bytes_of["branches.en.embed.weight" + SCALE_SUFFIX] == 50 * 8 + 50 * 4


def test_a_model_file_with_int8_tables_loads_as_the_rounded_model(tmp_path):
    from mule.config.resolution import resolve
    from mule.data_catalog.model_files import load_model, model_digest, save_model, weights_digest
    from mule.mule_core.model import build_model, round_tables
    from mule.mule_core.vocabulary import Vocab, Vocabulary

    cfg = resolve("demo", {"output.tables": "int8"})
    vocabulary = Vocabulary(["en", "de"], {"en": Vocab(["<pad>", "<unk>", "a", "dog", "runs"]), "de": Vocab(["<pad>", "<unk>", "ein", "hund"])},
                            ngram_lengths=tuple(cfg.model.ngram_lengths) if cfg.model.subwords else ())  # fmt: skip
    vocabulary.vectors = {lang: torch.randn(len(v), cfg.text.word_dim) for lang, v in vocabulary.vocabs.items()}
    model = build_model(cfg.model, vocabulary, image_dim=16)
    names = round_tables(model, {"en": "int8", "de": "int8"})
    assert "branches.en.embed.weight" in names and set(names.values()) == {"int8"}
    path = tmp_path / "model.pt"
    save_model(path, model, cfg, vocabulary, tables={"en": "int8", "de": "int8"})
    stored = torch.load(path, map_location="cpu", weights_only=True)
    assert stored["tables"] == {"en": "int8", "de": "int8"}
    assert stored["state_dict"]["branches.de.embed.weight"].dtype == torch.int8
    loaded, _ = load_model(path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert model_digest(path) == weights_digest(vocabulary.words, model.state_dict())


def test_output_tables_names_a_precision_and_the_old_switch_reads_as_it():
    from mule.config.resolution import resolve
    from mule.mule_core.settings import ConfigError

    assert resolve(None, {}).output.tables == "int8"
    assert resolve(None, {"output.half_tables": "false"}).output.tables == "float32"
    assert resolve(None, {"output.half_tables": True}).output.tables == "float16"
    with pytest.raises(ConfigError, match="output.tables must be one of float32, float16, int8"):
        resolve(None, {"output.tables": "int4"})
