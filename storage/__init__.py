"""The workdir's machinery, below the catalog: its layout (workdir.py), atomic writes and
locks (atomic.py, locks.py), digests of contents and of code (content_digests.py;
code_digests.py: a module's import closure, the code part of a stage's key), empty MLflow
and Prefect databases (store_templates.py), and the fault points the crash tests use
(faults.py)."""
