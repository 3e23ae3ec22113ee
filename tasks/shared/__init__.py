"""What the stages share, none of it a stage: what a computation is handed (context.py), the
training stages' checkpoints and records (training.py), how an image becomes a vector
(extraction.py: its import closure is the features' identity), and what must be in place
before a stage's key is taken (prepare.py)."""
