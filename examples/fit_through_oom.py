"""The run that worked yesterday and dies today — and memfit.fit finishing it.

A detection-style dataset whose second shard holds images at twice the resolution, trained
under an emulated 160 MiB card. Plain `model.fit` dies with ResourceExhaustedError when the
large images arrive; `memfit.fit` with the same arguments splits those batches into
micro-batches, finishes every epoch with the same number of optimizer updates, and says what
it did. Run: python examples/fit_through_oom.py (about a minute on 2 CPU cores).
"""

import memfit

memfit.emulate("160MiB")  # first thing: before any model or tensor exists

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def build() -> keras.Model:
    keras.utils.set_random_seed(1)
    inputs = keras.Input((None, None, 3))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(4)(h))  # one box per image
    model.compile(optimizer="adam", loss="mse")
    return model


def dataset() -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    shards = []
    for size in (64, 128):  # yesterday's images, then today's at twice the resolution
        x = rng.uniform(0, 1, (32, size, size, 3)).astype("float32")
        y = rng.uniform(0, 1, (32, 4)).astype("float32")
        shards.append(tf.data.Dataset.from_tensor_slices((x, y)).batch(16))
    return shards[0].concatenate(shards[1])


def main() -> None:
    try:
        build().fit(dataset(), epochs=2, verbose=0)
        print("plain model.fit: completed")
    except tf.errors.ResourceExhaustedError:
        print("plain model.fit: died with ResourceExhaustedError on the large images")

    model = build()
    history = memfit.fit(model, dataset(), epochs=2, verbose=0)
    summary = history.memfit
    print(
        f"memfit.fit: {len(history.history['loss'])} epochs, {summary.updates} updates, "
        f"loss {history.history['loss'][-1]:.4f}"
    )
    print(f"micro-batches per input shape: {summary.micro_batches}")


if __name__ == "__main__":
    main()
