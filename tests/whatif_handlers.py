"""Handlers for a `WhatIfQueue`'s child in tests/test_estimate_helper.py (no TensorFlow)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def open_echo(**_kwargs: Any) -> Callable[..., dict[str, Any]]:
    """A child that makes each what-if at once: its figures name the variant and the process."""

    def estimate(**variant: Any) -> dict[str, Any]:
        return {
            "variant": variant,
            "pid": os.getpid(),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    return estimate


def open_dying(**_kwargs: Any) -> Callable[..., dict[str, Any]]:
    """A child that dies on its first what-if."""

    def estimate(**_variant: Any) -> dict[str, Any]:
        os._exit(3)

    return estimate


def open_failing(**_kwargs: Any) -> Callable[..., dict[str, Any]]:
    """A child that cannot prepare."""
    raise RuntimeError("cannot prepare")
