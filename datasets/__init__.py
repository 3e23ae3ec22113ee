"""The formats mule reads: the registry keyed by data.format (formats.py), one reader per
layout (readers/), the generated datasets' front (generated.py), image files opened safely
(image_files.py), and word-vector and lexicon files (vector_files.py, lexicons.py)."""
