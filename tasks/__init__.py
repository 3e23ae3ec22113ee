"""The stages' computations: each reads the catalog entries its stage declares, writes the
ones it declares, and returns a summary (pipeline.declaration names them; pipeline.runner
runs them; pipeline.publish makes their figures and MLflow records afterwards)."""
