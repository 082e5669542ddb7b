"""Child of test_search.py: a model no child can rebuild, searched in this process."""

from child import emit

import numpy as np
import memfit
import keras

class Unsaveable(keras.layers.Dense):
    def get_config(self):
        raise NotImplementedError("no config")

model = keras.Sequential([keras.Input((1024,)), Unsaveable(2048, activation="relu"),
                          keras.layers.Dense(10)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.optimizer.build(model.trainable_variables)
before = [np.array(v.numpy()) for v in model.variables + model.optimizer.variables]
result = memfit.find_batch_size(
    model, margin=0.05, max_batch=4096, options=memfit.Options(soak_steps=2)
)
after = [np.array(v.numpy()) for v in model.variables + model.optimizer.variables]
emit({**result.to_dict(),
      "same": all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))})
