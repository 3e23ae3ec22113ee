"""The generated datasets (`mule demo`, the dataset named `embedded`, and its COCO and table
variants): scenes of shapes and their pictures (scenes.py), what each caption says
(plans.py), a grammar per language (lang_*.py), the files in each layout
(multi30k_layout.py, coco_layout.py, table_layout.py), and the best a model can reach on
them (ceiling.py)."""
