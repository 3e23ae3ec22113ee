"""The model library: PyTorch and numpy, with the libraries its parts need (ONNX and ONNX
Runtime for the CPU extractor, timm and torchvision for the backbones, Pillow for images,
sacremoses, janome, jieba, regex and langcodes for tokenising); no pipeline state, file
layouts, Prefect or MLflow, and nothing else of mule (as open_clip's model code needs
nothing of its training app).

What a user of a trained model needs is `mule.api.load`, which returns this library's
Embedder. For building on the model itself:

    settings.ModelSettings   what a saved model needs to be rebuilt (extractor, text, model)
    model.create_model       an untrained model for some languages' vocabularies
    model.MuleModel          per-language word vectors and FC into MULE; the shared sentence encoder and image branch
    losses                   the triplet, NC and LC losses over the most violated constraints
    trainer.Trainer          LP and joint training with validation, best epoch kept
    encoding                 every caption's and image's vectors of a split, and the recalls over them
    metrics                  R@1/5/10 both directions and mR, per language
    tokenizers, vocabulary   tokenising; vocabularies (Vocabulary.encode: unseen words from character n-grams)
    embedder.Embedder        a trained model as a function: encode_text, encode_image, preprocess
    backbones                the image extractor's networks and crops

    from mule.mule_core import ModelConfig, Vocab, create_model
    model = create_model(ModelConfig(), {"en": Vocab.build([["a", "dog"]])}, image_dim=2048)

The names below are importable from `mule.mule_core` itself (loaded when first used, so
reading a config never imports torch).
"""

_EXPORTS = {"ModelSettings": "settings", "ModelConfig": "settings", "TrainConfig": "settings",
            "MuleModel": "model", "create_model": "model", "Embedder": "embedder", "EmbedError": "embedder",
            "Trainer": "trainer", "Vocabulary": "vocabulary", "Vocab": "vocabulary"}  # fmt: skip


def __getattr__(name: str):
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_EXPORTS)
