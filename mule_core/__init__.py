"""The model library: PyTorch and numpy only, no files, Prefect or MLflow.

What a user of a trained model needs is `mule.api.load`, which returns this library's
Embedder. For building on the model itself:

    config.ModelSettings   what a saved model needs to be rebuilt (extractor, text, model, losses, training)
    model.MuleModel        per-language word vectors and FC into MULE; the shared sentence encoder and image branch
    losses                 the triplet, NC and LC losses over the most violated constraints
    training.Trainer       LP and joint training with validation, best epoch kept
    metrics                R@1/5/10 both directions and mR, per language
    text, subwords         tokenizing; vocabularies (text.Vocabulary.encode: unseen words from character n-grams)
    embedder.Embedder      a trained model as a function: encode_text, encode_image, preprocess
    features               the image extractor's networks and crops

The names below are importable from `mule.mule_core` itself (loaded when first used, so
reading a config never imports torch).
"""

_EXPORTS = {"ModelSettings": "config", "MuleModel": "model", "Embedder": "embedder", "EmbedError": "embedder",
            "Trainer": "training", "Vocabulary": "text"}  # fmt: skip


def __getattr__(name: str):
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_EXPORTS)
