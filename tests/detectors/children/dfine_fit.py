"""Child of test_detectors_dfine.py: D-FINE at 128 px, batches of 32 under a 150 MiB card,
trained by `memfit.fit` with a Watch logging to `log`.
"""

from child import arguments, emit

import memfit

memfit.emulate("150MiB")
from mypkg import detectors as d

model = d.dfine_detector(128, 32)
watch = memfit.Watch(log_path=arguments()["log"], name="d-fine", verbose=False)
data = d.dfine_samples(64, 128).batch(32)
history = memfit.fit(model, data, epochs=1, callbacks=[watch], verbose=0)
emit({"summary": history.memfit.to_dict(),
      "updates": int(model.optimizer.iterations.numpy()),
      "loss": float(history.history["loss"][-1]),
      "findings": [f.to_dict()["kind"] for f in watch.findings]})
