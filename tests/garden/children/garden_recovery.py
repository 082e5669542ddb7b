"""Child of test_garden_recovery.py: the Model Garden's RetinaNet trained through its task by
GuardedStep on its first batch cut to `sizes`. `mode` "budget": from fresh weights (saved with
the batch under `out`), under the test's card; "reference": the same weights and batch at the
K each size settled on, under a roomy card.
"""

from child import arguments, emit

import json
import os
import numpy as np
import memfit
import tensorflow as tf
import official.vision  # noqa: F401 - registers the Model Garden's vision experiments
from official.core import exp_factory, task_factory
from memfit.data.synth import write_dataset

# One inter-op thread: near the limit, ops of several threads waiting in the BFC allocator's
# retry for memory that only the others can free stalled a step for minutes.
tf.config.threading.set_inter_op_parallelism_threads(1)
MIB = 2 ** 20
ARGS = arguments()
directory, out, mode = ARGS["directory"], ARGS["out"], ARGS["mode"]
sizes = ARGS["sizes"]
if not os.path.exists(os.path.join(directory, "done")):
    write_dataset(directory, count=20, shards=2, image_size=(256, 256), num_classes=5,
                  max_objects=4)
    open(os.path.join(directory, "done"), "w").close()
config = exp_factory.get_exp_config("retinanet_resnetfpn_coco")
config.override({"task": {
    "init_checkpoint": None,
    "model": {"input_size": [256, 256, 3], "num_classes": 6,
              "backbone": {"resnet": {"model_id": 18}}},
    "train_data": {"input_path": os.path.join(directory, "train-*"), "global_batch_size": 10,
                   "parser": {"aug_rand_hflip": False}}}}, is_strict=False)
task = task_factory.get_task(config.task)
iterator = iter(task.build_inputs(config.task.train_data))
batch = next(iterator)
del iterator  # no prefetching pipeline beside the steps

def used():
    return tf.config.experimental.get_memory_info("CPU:0")["current"]

def train(model, micro_batches=None):
    optimizer = task.create_optimizer(config.trainer.optimizer_config, config.runtime)
    step = memfit.GuardedStep.from_task(task, model, optimizer, verbose=False)
    if micro_batches is not None:
        step.resume_micro_batches(micro_batches)
    rows = []
    for n in sizes:
        before, recoveries = used(), len(step.summary.recoveries)
        logs = step(tf.nest.map_structure(lambda t: t[:n], batch))  # noqa: B023
        rows.append({"size": n, "before": before, "after": used(),
                     "recoveries": len(step.summary.recoveries) - recoveries,
                     "loss": float(logs["loss"])})
    return {"rows": rows, "updates": step.summary.updates,
            "iterations": int(optimizer.iterations.numpy()),
            "micro_batches": dict(step.summary.micro_batches),
            "messages": [r.message for r in step.summary.recoveries],
            "weights": [v.numpy() for v in model.trainable_variables]}

model = task.build_model()
if mode == "budget":
    np.savez(out + "-init.npz", *model.get_weights())
    # bfloat16 images as float32 (NumPy has no bfloat16), cast back on loading: exact.
    np.savez(out + "-batch.npz", *[
        tf.cast(t, tf.float32).numpy() if t.dtype == tf.bfloat16 else t.numpy()
        for t in tf.nest.flatten(batch)])
    result = train(model)
    np.savez(out + "-budget.npz", *result.pop("weights"))
    emit(result)
else:
    init = np.load(out + "-init.npz")
    init = [init[f"arr_{i}"] for i in range(len(init.files))]
    saved = np.load(out + "-batch.npz")
    arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    batch = tf.nest.pack_sequence_as(batch, [
        tf.cast(tf.constant(a), t.dtype)
        for a, t in zip(arrays, tf.nest.flatten(batch), strict=True)])
    def load(model):
        model.set_weights(init)
        for v in model.variables:  # copied by TensorFlow, so counted in bytes in use as built
            v.assign(v * tf.ones((), v.dtype))  # ones (set_weights may alias NumPy's arrays)

    load(model)
    with open(out + "-k.json") as handle:
        settled = json.load(handle)
    same_k = train(model, settled)
    np.savez(out + "-same-k.npz", *same_k.pop("weights"))
    emit({"same_k": same_k})
