"""Plan check: whether a built model is the build a `memfit.Plan` was made for.

A plan's peak was measured on the model built under its precision (dtype policy) and
recompute (`keras.RematScope`) mode. A built model cannot change either, so `memfit.fit`
refuses a plan made for another build (`check_plan`), reading the build from the model's
layers (`model_precision`, `model_remat`).
"""

from __future__ import annotations

from typing import Any

from memfit.errors import MemfitError


def model_precision(model: Any) -> str:
    """The dtype policy a built Keras model computes in, e.g. `"float32"`, `"mixed_float16"`.

    The policy most of the model's layers with weights were built under (a mixed-precision
    model often keeps its last layer in float32); the model's own policy if no layer has
    weights.

    Args:
        model: a built `keras.Model`.

    Returns:
        The policy's name.

    Example:
        >>> from memfit.training.plan_check import model_precision
        >>> keras.mixed_precision.set_dtype_policy("mixed_float16")
        >>> model_precision(keras.applications.MobileNetV2(weights=None))
        'mixed_float16'
    """
    counts: dict[str, int] = {}
    for layer in model._flatten_layers(include_self=False):
        leaf = not any(True for _ in layer._flatten_layers(include_self=False))
        if leaf and layer.weights:
            name = layer.dtype_policy.name
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        return str(model.dtype_policy.name)
    return max(counts, key=lambda name: counts[name])


def model_remat(model: Any) -> set[str]:
    """The `keras.RematScope` modes a built Keras model's layers were built under.

    Args:
        model: a built `keras.Model`.

    Returns:
        The modes (`"larger_than"`, `"activations"`, ...); empty when built without recompute.

    Example:
        >>> from memfit.training.plan_check import model_remat
        >>> with keras.RematScope(mode="larger_than"):
        ...     model = keras.applications.MobileNetV2(weights=None)
        >>> model_remat(model)
        {'larger_than'}
    """
    return {
        layer._remat_mode.mode
        for layer in model._flatten_layers(include_self=True)
        if getattr(layer, "_remat_mode", None) is not None
    }


def check_plan(model: Any, plan: Any) -> None:
    """Refuse a plan made for another build of the model: its precision or recompute differs.

    A plan's peak was measured on the model built under its dtype policy and recompute
    (`keras.RematScope`) mode, and a built model cannot change either, so K alone would not
    make its step fit.

    Args:
        model: the built `keras.Model` to train.
        plan: a `memfit.Plan` (its `precision` and `remat`).

    Raises:
        MemfitError: what the plan assumed, what the model was built with, and what to do.

    Example:
        ```python
        plan = memfit.plan("mypkg.models:build", 256, budget="T4")
        with plan.build_scope():                   # the plan's precision and recompute
            model = mypkg.models.build()
        memfit.fit(model, x, y, batch_size=256, plan=plan)
        ```
    """
    precision = model_precision(model)
    planned = plan.precision or "float32"
    if precision != planned:
        raise MemfitError(
            f"the plan is for precision {planned}, but the model was built with "
            f"{precision}, and a built model cannot change precision: build it after "
            f'keras.mixed_precision.set_dtype_policy("{planned}") (or inside '
            f'`with plan.build_scope():`), or plan with precisions=["{precision}"] '
            f"(--precision {precision})"
        )
    modes = model_remat(model)
    if plan.remat == "memfit":  # memfit's recompute: memfit.fit applies it to any build
        if modes:
            raise MemfitError(
                f"the plan is for memfit's recompute, but the model was built with remat "
                f"{', '.join(sorted(modes))}: build it outside keras.RematScope"
            )
    elif plan.remat is not None and plan.remat not in modes:
        raise MemfitError(
            f"the plan is for recompute (remat) {plan.remat!r}, but the model was built "
            + (f"with remat {', '.join(sorted(modes))}" if modes else "without it")
            + f': build it inside `with keras.RematScope(mode="{plan.remat}"):` (or '
            f"`with plan.build_scope():`), or plan with remat_modes=[None] (--remat none)"
        )
    if plan.remat is None and modes:
        raise MemfitError(
            f"the plan is for no recompute (remat), but the model was built with remat "
            f"{', '.join(sorted(modes))}, whose memory the plan did not measure: build it "
            f"outside keras.RematScope, or plan with remat_modes=[{sorted(modes)[0]!r}]"
        )
