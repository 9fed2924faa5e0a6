"""What makes a TPU step slow, reported at the line: host syncs in the training loop,
data-dependent shapes, batches padded to their own length, and head dims the matrix units
do not fit."""
