"""The pipeline: the stages declared once (declaration), the keys that decide whether a
stage runs or is reused (reuse; the code part: storage.code_digests), the one runner
(runner), what follows a computation (publish), the sweeps (sweeps) and the rebuild's
body without Prefect (rebuild)."""
