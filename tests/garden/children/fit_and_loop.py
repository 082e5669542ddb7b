"""Child of test_tf_keras_step.py: GuardedStep and memfit.fit against tf_keras' own fit, legacy
SGD and Adam.
"""

from child import emit

from tf_keras_model import build, weights, x, y  # first: memfit, then TensorFlow
import tensorflow as tf
import tf_keras

import memfit

out = {}
for name in ("legacy_sgd", "adam"):
    plain = build(name)
    plain.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    fitted = build(name)
    h = memfit.fit(fitted, x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
                   micro_batches=4)
    # A custom loop: the tf_keras optimizer and a loss_fn, GuardedStep per batch.
    looped = build(name)
    optimizer = looped.optimizer
    mse = tf_keras.losses.MeanSquaredError()
    step = memfit.GuardedStep(looped, micro_batches=2, optimizer=optimizer,
                              loss_fn=lambda a, b: mse(b, looped(a, training=True)))  # noqa: B023
    for i in range(4):
        logs = step((tf.constant(x[16 * i:16 * (i + 1)]), tf.constant(y[16 * i:16 * (i + 1)])))
    out[name] = {"plain": weights(plain), "fit": weights(fitted), "loop": weights(looped),
                 "updates": h.memfit.updates, "iterations": int(fitted.optimizer.iterations),
                 "loop_iterations": int(optimizer.iterations), "loss": float(logs["loss"]),
                 "optimizer": type(optimizer).__module__}
emit(out)
