"""What the stages share, none of it a stage: what a computation is handed (context.py), the
training stages' checkpoints and records (checkpoints.py), how an image becomes a vector
(extraction.py: its import closure is the features' identity), what must be in place
before a stage's key is taken (preparation.py), the tokenisers' identities
(token_identity.py), fastText in a process of its own (fasttext_worker.py). Words across
languages (multilingual-e5, aligned starts, translation tables) are a room of their own: words/."""
