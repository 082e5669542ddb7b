"""Child of test_watch_oom.py: whether the net trains 4 batches of `batch` images of `side`
pixels under the budget (a finding's numbers, checked).
"""

from child import arguments, emit

from oom_scenarios import batches, net  # first: memfit before TensorFlow

ARGS = arguments()
m = net()
m.fit(batches([(ARGS["batch"], ARGS["side"], 4)]), epochs=1, verbose=0)
emit("trained")
