"""Model factories the tests build (`import factories`) and hand to memfit's child processes
(`factories:NAME`).

All are one small CNN without BatchNorm (`conv_net`): two 3x3 convolutions, max pooling, a
third convolution, global average pooling and a dense head, compiled. The benchmarks build the
same network from `bench.models` (bench does not import from tests/).
"""

from __future__ import annotations

from typing import Any


def conv_net(
    input_shape: tuple[int | None, ...] = (None, None, 3),
    widths: tuple[int, int, int] = (32, 32, 64),
    outputs: int = 4,
    activation: str | None = None,
    *,
    loss: str = "mse",
    optimizer: Any = None,
    seed: int = 1,
) -> Any:
    """A compiled CNN without BatchNorm: conv, conv, max-pool, conv, global pooling, dense.

    Args:
        input_shape: one sample's shape; `(None, None, 3)` takes RGB images of any size.
        widths: the filters of the three convolutions.
        outputs: units of the dense head.
        activation: the head's activation (None: linear, e.g. box regression).
        loss: the loss it is compiled with.
        optimizer: the optimizer it is compiled with (default: Adam, learning rate 1e-3).
        seed: `keras.utils.set_random_seed` before the layers are built (same weights).

    Example:
        >>> conv_net((64, 64, 3), outputs=10, activation="softmax").count_params()
        29290
    """
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input(input_shape)
    h = keras.layers.Conv2D(widths[0], 3, padding="same", activation="relu")(inputs)
    h = keras.layers.Conv2D(widths[1], 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(widths[2], 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(outputs, activation=activation)(h))
    model.compile(optimizer=optimizer or keras.optimizers.Adam(1e-3), loss=loss)
    return model


def small_cnn() -> Any:
    """A compiled CNN without BatchNorm whose step at batch 32, 64x64, needs ~100+ MiB."""
    return conv_net(
        (64, 64, 3),
        outputs=10,
        activation="softmax",
        loss="sparse_categorical_crossentropy",
        optimizer="adam",
    )


def any_size_cnn() -> Any:
    """A compiled CNN without BatchNorm for images of any size (global pooling, 4 outputs, mse)."""
    return conv_net(widths=(16, 16, 32))


def detector_cnn(seed: int = 1, optimizer: Any = None) -> Any:
    """A detector-style CNN for images of any size: a 4-number box head, mse, Adam 1e-3.

    The network of test_fit's and test_backup's real-OOM tests: its step at batch 16 on
    128x128 inputs does not fit in 128 MiB, on 64x64 inputs it does.
    """
    return conv_net(seed=seed, optimizer=optimizer)


def box_shards(
    sizes: tuple[int, ...] = (64, 128), per_shard: int = 32, seed: int = 0
) -> list[tuple[Any, Any]]:
    """Shards of a detection-style dataset: random RGB images and 4-number boxes per size.

    Args:
        sizes: each shard's image side, in order (by default the later shard at twice the
            resolution of the first: under 128 MiB, `detector_cnn` needs K > 1 there).
        per_shard: samples in each shard.
        seed: of the random numbers (drawn shard after shard).

    Returns:
        `(x, y)` float32 arrays per shard.

    Example:
        >>> [x.shape for x, _ in box_shards()]
        [(32, 64, 64, 3), (32, 128, 128, 3)]
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for size in sizes:
        x = rng.uniform(0, 1, (per_shard, size, size, 3)).astype("float32")
        y = rng.uniform(0, 1, (per_shard, 4)).astype("float32")
        out.append((x, y))
    return out


def box_dataset(sizes: tuple[int, ...] = (64, 128), batch: int = 16) -> Any:
    """`box_shards(sizes)` as one `tf.data.Dataset`, each shard batched by `batch`, in order."""
    import tensorflow as tf

    parts = [tf.data.Dataset.from_tensor_slices(s).batch(batch) for s in box_shards(sizes)]
    dataset = parts[0]
    for part in parts[1:]:
        dataset = dataset.concatenate(part)
    return dataset
