"""Child of test_watch_oom.py: a first step that never fits (batch 128 under 400 MiB), under
plain `fit` and under `memfit.fit`, each watched.
"""

from child import emit

from oom_scenarios import batches, result, run  # first: memfit before TensorFlow

run("plain", batches([(128, 96, 3)]))
run("guarded", batches([(128, 96, 3)]), guarded=True)
emit(result)
