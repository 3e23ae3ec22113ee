"""The pipeline's stages, declared once (pipeline.declaration), and the keys that decide
whether a rebuild runs or reuses each of them (pipeline.reuse, pipeline.code_keys)."""
