"""A custom GradientTape training loop made OOM-proof with memfit.GuardedStep.

The loop keeps its shape — for each batch, compute the loss and update — but the update is
one call: GuardedStep splits a batch that does not fit into micro-batches, sums their
gradients, applies them once, and on an out-of-memory error retries the same batch with more
micro-batches, every variable as it was. Run it under a small emulated card to see that:

    python examples/custom_loop.py            # 160 MiB card: the 128x128 batches are split
"""

import memfit

memfit.emulate("160MiB")  # before TensorFlow allocates anything

import keras  # noqa: E402
import numpy as np  # noqa: E402


def build() -> keras.Model:
    inputs = keras.Input((None, None, 3))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(10)(h))


def main() -> None:
    keras.utils.set_random_seed(0)
    model = build()
    optimizer = keras.optimizers.Adam(1e-3)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    # Before: with tf.GradientTape() as tape: ...; optimizer.apply_gradients(...)
    step = memfit.GuardedStep(
        model,
        optimizer=optimizer,
        loss_fn=lambda x, y: loss(y, model(x, training=True)),
    )
    rng = np.random.default_rng(0)
    for epoch in range(2):
        for size in (64, 128):  # the second half of each epoch has larger images
            x = rng.uniform(size=(16, size, size, 3)).astype("float32")
            y = rng.integers(0, 10, 16)
            logs = step((x, y))
            print(f"epoch {epoch + 1}, {size}x{size}: loss {float(logs['loss']):.4f}")
    print(
        f"{int(optimizer.iterations)} updates; micro-batches per shape: "
        f"{step.summary.micro_batches}"
    )
    for recovery in step.summary.recoveries:
        print(recovery)


if __name__ == "__main__":
    main()
