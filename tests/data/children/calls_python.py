"""Child of test_data_service.py:
test_a_pipeline_that_calls_python_is_refused_before_any_worker_starts.
"""

from child import emit

from served import B, build, workers, x, y
import memfit
import tensorflow as tf

ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(B)
ds = ds.map(lambda a, b: (tf.py_function(lambda t: t, [a], tf.float32), b))
try:
    memfit.fit(build(), ds, data_service=1, verbose=0)
except memfit.MemfitError as exc:
    emit({"error": str(exc), "type": type(exc).__name__, "left": len(workers())})
