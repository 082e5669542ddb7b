"""Keras 3 and tf_keras side by side: models and optimizers through one set of calls.

memfit's step runs on Keras 3 models, and on the tf_keras (Keras 2) models the TF Model
Garden builds, with their optimizers: Keras 3's, tf_keras' new ones (`tf_keras.optimizers`)
and its legacy `OptimizerV2` (`tf_keras.optimizers.legacy`, what the Model Garden's
optimizer factory makes), each optionally inside a `LossScaleOptimizer`. They differ where
the step touches them: how an optimizer is built before its first update, whether
`variables` is a list or a method, and how a loss is scaled for mixed precision (Keras 3's
`scale_loss`, unscaled inside `apply_gradients`; tf_keras' `get_scaled_loss` and
`get_unscaled_gradients`, called by the step). tf_keras is never imported here: an object is
tf_keras' when its class comes from the `tf_keras` package.
"""

from __future__ import annotations

import sys
from typing import Any

from memfit.backend.tf_import import import_keras


def is_tf_keras(obj: Any) -> bool:
    """Whether `obj` (a model, layer or optimizer) is a tf_keras (Keras 2) object.

    Example:
        ```python
        is_tf_keras(tf_keras.optimizers.legacy.SGD())   # True
        is_tf_keras(keras.optimizers.SGD())             # False
        ```
    """
    return any(
        (getattr(cls, "__module__", "") or "").split(".")[0] == "tf_keras"
        for cls in type(obj).__mro__
    )


def is_model(obj: Any) -> bool:
    """Whether `obj` is a Keras 3 `keras.Model` or a tf_keras `Model`.

    Example:
        ```python
        is_model(keras.applications.MobileNetV2(weights=None))   # True
        is_model("model.keras")                                  # False
        ```
    """

    if isinstance(obj, import_keras().Model):
        return True
    tf_keras = sys.modules.get("tf_keras")
    return tf_keras is not None and isinstance(obj, tf_keras.Model)


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer's variables: its iteration count and slots (and a loss scale's state).

    `variables` is a list on Keras 3 and a method on tf_keras' optimizers. A tf_keras
    `LossScaleOptimizer` keeps its loss scale and good-step count apart from its
    `variables()`; they are added, so a snapshot of the update's state holds them too.

    Example:
        ```python
        saved = [v.numpy() for v in optimizer_variables(model.optimizer)]
        ```
    """
    found = getattr(optimizer, "variables", None)
    if found is None:
        return []
    items = list(found() if callable(found) else found)
    if is_tf_keras(optimizer):
        scale = getattr(optimizer, "_loss_scale", None)  # legacy LossScaleOptimizer
        extra = [getattr(scale, name, None) for name in ("_current_loss_scale", "_num_good_steps")]
        # LossScaleOptimizerV3 keeps them itself.
        extra += [getattr(optimizer, n, None) for n in ("_current_loss_scale", "_num_good_steps")]
        seen = {id(v) for v in items}
        for v in extra:
            if v is not None and hasattr(v, "assign") and id(v) not in seen:
                seen.add(id(v))
                items.append(v)
    return items


def build_optimizer(optimizer: Any, variables: list[Any]) -> None:
    """Create the optimizer's slots for `variables` now, before its first update.

    A guarded update saves the state it changes before it runs: that state must exist.
    Keras 3 and tf_keras' new optimizers have `build`; the legacy `OptimizerV2` creates its
    slots in `_create_all_weights` (which does nothing for slots that exist). Call it inside
    the model's distribution strategy scope.

    Example:
        ```python
        with model.distribute_strategy.scope():
            build_optimizer(optimizer, model.trainable_variables)
        ```
    """
    if hasattr(optimizer, "_create_all_weights"):  # tf_keras' legacy OptimizerV2
        optimizer._create_all_weights(variables)
        return
    if is_tf_keras(optimizer):
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        if not getattr(inner, "_built", False):
            optimizer.build(variables)
        return
    if not optimizer.built:
        optimizer.build(variables)


def scale_loss(optimizer: Any, loss: Any) -> Any:
    """The loss to differentiate: scaled by a mixed-precision loss scale, else as it is.

    Example:
        ```python
        grads = tape.gradient(scale_loss(optimizer, loss), variables)
        grads = unscale_gradients(optimizer, grads)
        ```
    """
    if is_tf_keras(optimizer):
        scaled = getattr(optimizer, "get_scaled_loss", None)
        return scaled(loss) if scaled is not None else loss
    return optimizer.scale_loss(loss)


def unscale_gradients(optimizer: Any, grads: list[Any]) -> list[Any]:
    """Gradients of a `scale_loss`ed loss made ready for `apply_gradients`.

    tf_keras' `LossScaleOptimizer` expects unscaled gradients (its step calls
    `get_unscaled_gradients`); Keras 3's unscales inside `apply_gradients`.

    Example:
        ```python
        optimizer.apply_gradients(zip(unscale_gradients(optimizer, grads), variables))
        ```
    """
    unscale = getattr(optimizer, "get_unscaled_gradients", None)
    if is_tf_keras(optimizer) and unscale is not None:
        return list(unscale(grads))
    return grads
