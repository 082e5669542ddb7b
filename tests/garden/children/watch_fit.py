"""Child of test_tf_keras_watch.py: tf_keras' own model.fit with a Watch logging to `log`.
"""

from child import arguments, emit

from watched_model import model, x, y  # first: memfit, then TensorFlow
import memfit
import tf_keras

model.compile(tf_keras.optimizers.Adam(1e-3),
              tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
watch = memfit.Watch(log_path=arguments()["log"], verbose=False)
history = model.fit(x, y, batch_size=8, epochs=2, callbacks=[watch], verbose=0)
emit({"steps": len(watch.steps), "losses": history.history["loss"]})
