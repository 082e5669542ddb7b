"""`mypkg.models:build`, the model factory the docstring examples plan for (a tiny CNN)."""

from __future__ import annotations

from typing import Any


def build() -> Any:
    """A compiled CNN for 32x32 RGB images in 10 classes, as a user's factory returns it."""
    import keras

    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(h))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model
