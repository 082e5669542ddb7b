"""Models and data the option tests hand to memfit's child processes (`option_models:NAME`)."""

from __future__ import annotations

from typing import Any


def any_size_cnn() -> Any:
    """A compiled CNN whose inputs take any image size (the size comes from outside)."""
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((None, None, 3))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(h))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def samples_40px() -> Any:
    """Eight unbatched (image, label) samples of 40x40x3."""
    import numpy as np
    import tensorflow as tf

    x = np.zeros((8, 40, 40, 3), "float32")
    y = np.zeros((8,), "int64")
    return tf.data.Dataset.from_tensor_slices((x, y))


def save_lambda_model(path: str) -> None:
    """Save a compiled model with a Lambda layer: loading it runs Python code (unsafe)."""
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Lambda(lambda t: t * 2.0)(inputs)
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(4)(h))
    model.compile(optimizer="adam", loss="mse")
    model.save(path)


def repeated_samples() -> Any:
    """Unbatched (image, label) samples that repeat for ever, as the Model Garden's input
    pipelines do: eight 24x24x3 images and one 32x32x3 (the largest), then again."""
    import numpy as np
    import tensorflow as tf

    small = tf.data.Dataset.from_tensor_slices(
        (np.zeros((8, 24, 24, 3), "float32"), np.zeros((8,), "int64"))
    )
    large = tf.data.Dataset.from_tensors((np.ones((32, 32, 3), "float32"), np.int64(1)))
    return small.concatenate(large).repeat()


def endless_generator_samples() -> Any:
    """Unbatched (image, label) samples from a Python generator that never ends: a dataset
    whose length TensorFlow cannot tell (unknown cardinality)."""
    import itertools

    import numpy as np
    import tensorflow as tf

    def samples() -> Any:
        for i in itertools.count():
            side = 24 if i % 9 else 32
            yield np.full((side, side, 3), i % 7, "float32"), np.int64(i % 10)

    return tf.data.Dataset.from_generator(
        samples,
        output_signature=(
            tf.TensorSpec((None, None, 3), tf.float32),
            tf.TensorSpec((), tf.int64),
        ),
    )
