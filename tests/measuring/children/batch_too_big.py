"""Child of test_measure.py::test_a_batch_whose_inputs_alone_do_not_fit_is_an_oom."""

from child import emit

import memfit
import keras
model = keras.Sequential([keras.Input((1024, 1024)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
r = memfit.measure(model, 64, repeats=1)      # inputs alone: 256 MiB
ok = memfit.measure(model, 1, repeats=1)      # and the process goes on
emit({"oom": r.oom, "message": r.oom_message, "leak": r.leaked_bytes, "ok": ok.oom})
