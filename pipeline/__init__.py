"""The pipeline's stages, declared once (pipeline.declaration), and the keys that decide
whether a rebuild runs or reuses each of them (pipeline.reuse; the code part: data_catalog.code_digests)."""
