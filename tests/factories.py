"""Model factories the tests hand to memfit's child processes (`factories:NAME`)."""

from __future__ import annotations

from typing import Any


def small_cnn() -> Any:
    """A compiled CNN without BatchNorm whose step at batch 32, 64x64, needs ~100+ MiB."""
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((64, 64, 3))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(h))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def any_size_cnn() -> Any:
    """A compiled CNN without BatchNorm for images of any size (global pooling, 4 outputs, mse)."""
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((None, None, 3))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(4)(h))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return model
