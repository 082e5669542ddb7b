"""Backends: the only place memfit touches framework internals.

Today there is one, TensorFlow (`memfit.backend.tf`). Everything else in memfit talks to it
through the functions it exports, so a JAX or PyTorch Keras backend can be added beside it.
"""
