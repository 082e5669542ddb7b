"""Workload: what is trained, as one value a child process rebuilds.

The model, its samples and its step (the model's own, a Model Garden task's, or split in
micro-batches).
"""
