"""A child-process job for test_isolate: a small batch, then one far over the budget."""

import memfit


def small_then_huge() -> dict:
    import keras

    model = keras.applications.MobileNetV2(weights=None, input_shape=(64, 64, 3))
    model.compile("adam", "sparse_categorical_crossentropy")
    first = memfit.measure(model, 2, options=memfit.Options(repeats=1))
    second = memfit.measure(model, 256, options=memfit.Options(repeats=1))
    return {"first_oom": first.oom, "second": second.to_dict()}
