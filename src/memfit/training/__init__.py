"""Training: `memfit.fit`, the guarded step, its recovery, the backup and resume of a run."""
