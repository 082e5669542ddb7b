"""Recomputation: memfit's gradient checkpointing and where it cuts a model's layer graph."""
