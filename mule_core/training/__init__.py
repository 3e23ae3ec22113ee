"""Training: the loop LP and joint training share (loop.py) and the parts it is made of,
each owning its state with a `state_dict()` (Lightning's way): the updates (updates.py:
Adam, the learning rate's schedule, AMP's scaler, the weight average of average.py), the
kept epoch and patience (best_epoch.py), the divergence guard (guard.py). A trainer's
checkpoint is its parts' states and the loop's own (epoch, history, why it stopped).
The two kinds (lp.py, joint.py) say what they train and their losses."""
