"""The catalog: where every piece of data lives and in what form. Parquet tables and their
DuckDB views (tables.py, table_access.py), every SQL statement (queries.py), the named
entries (entries.py) and which stage writes each (writers.py), a split as tensors
(splits.py), and the model, index, weights and export files (model_files.py, ...)."""
