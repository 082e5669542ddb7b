"""Will my model train on a T4, and with what batch size? Run: python examples/fit_on_a_t4.py

Emulates a T4's usable memory on whatever machine this runs on (a CPU is fine), measures one
training step of a MobileNetV2 classifier at a few batch sizes, then finds the largest batch that
fits with a 5% margin, up to 48. On a 2-core CPU the whole script takes a few minutes.
"""

import memfit

memfit.emulate(device="T4")  # first thing: before any model or tensor exists

import keras  # noqa: E402

model = keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3), classes=20)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")

for batch_size in (8, 32):
    print(memfit.measure(model, batch_size, options=memfit.Options(repeats=2)))

result = memfit.find_batch_size(model, margin=0.05, max_batch=48, progress=print)
print(result.summary())
