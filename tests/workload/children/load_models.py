"""Child of test_models.py::test_factories_files_and_builtins: loads the factories of
`directory`/mymodels.py, model files and built-ins, and the specs that fail.
"""

from child import arguments, emit

import os
import keras
import memfit
os.chdir(arguments()["directory"])
results = {}
m = memfit.load_model("mymodels:small")
results["factory"] = type(m).__name__
m.save("small.keras")
results["file"] = memfit.load_model("small.keras").optimizer.__class__.__name__
inputs = keras.Input((4,))
lam = keras.Model(inputs, keras.layers.Lambda(lambda t: t * 2)(inputs))
lam.save("lambda.keras")
b = memfit.load_model("keras.applications.MobileNetV2", input_shape=(64, 64, 3), classes=7)
results["builtin"] = list(b.output_shape)
for spec in ("mymodels:missing", "mymodels:broken", "mymodels:not_a_model",
             "mymodels:NUMBER", "nosuchmodule:f", "keras.applications.MobileNetV9",
             "lambda.keras"):
    try:
        memfit.load_model(spec)
        results[spec] = None
    except memfit.ModelLoadError as exc:
        results[spec] = str(exc)
results["unsafe_ok"] = type(memfit.load_model("lambda.keras", safe_mode=False)).__name__
emit(results)
