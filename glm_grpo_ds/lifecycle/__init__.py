"""A run's life on disk and in time: the shared output_dir (storage), checkpoints and resume, signals
(preempt) and rank 0's background jobs."""
