"""What a run shows of itself: metric files and the per-step record, trackers, reward curves, sample
galleries and the startup summary."""
