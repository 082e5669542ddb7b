"""A TF Model Garden task as a step spec: `memfit measure` / `estimate` of RetinaNet's own
`train_step` (ResNet-18, 128 px), named as `garden:EXPERIMENT --set ...` and as a module path,
and the one line each bad input gets."""

from __future__ import annotations

import json
import os

import pytest
from helpers import run_cli, run_isolated

HERE = os.path.dirname(os.path.abspath(__file__))
TASK = "garden:retinanet_resnetfpn_coco"


@pytest.fixture(scope="module")
def od_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = str(tmp_path_factory.mktemp("od"))
    run_isolated(
        f"""
        from memfit.data.synth import write_dataset
        write_dataset({folder!r}, count=8, shards=1, image_size=(128, 128), num_classes=5)
        emit(True)
        """
    )
    return folder


def small(folder: str) -> list[str]:
    """`--set` options of a small RetinaNet: ResNet-18, 128 px, 6 classes, no checkpoint."""
    values = [
        "task.init_checkpoint=null",
        "task.model.input_size=[128,128,3]",
        "task.model.num_classes=6",
        "task.model.backbone.resnet.model_id=18",
        f"task.train_data.input_path={folder}/train-*",
        "task.train_data.parser.aug_rand_hflip=false",
    ]
    return [arg for value in values for arg in ("--set", value)]


def env(folder: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), HERE) if p)
    return {"PYTHONPATH": path, "MEMFIT_TEST_OD": folder, "TF_CPP_MIN_LOG_LEVEL": "2"}


def one_line(proc: object) -> str:
    assert proc.returncode == 2, proc.stderr  # type: ignore[attr-defined]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("memfit: ")]  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("memfit: error: "), proc.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in proc.stderr  # type: ignore[attr-defined]
    return lines[0]


@pytest.mark.slow
def test_measure_and_estimate_of_the_tasks_own_step(od_data: str) -> None:
    common = [*small(od_data), "--memory", "2GiB", "--json"]
    measured = run_cli("measure", TASK, "-b", "2", *common, env=env(od_data))
    assert measured.returncode == 0, measured.stderr
    m = json.loads(measured.stdout)
    assert m["oom"] is False and m["batch_size"] == 2
    # ResNet-18 RetinaNet: ~19 M weights and SGD momentum, ~150 MiB before the step.
    assert 100 * 2**20 < m["resident_bytes"] < 250 * 2**20
    assert m["peak_bytes"] > m["resident_bytes"] + 50 * 2**20 and m["step_seconds"] > 0
    estimated = run_cli("estimate", TASK, "-b", "2", *common, "--samples", "0", env=env(od_data))
    assert estimated.returncode == 0, estimated.stderr
    e = json.loads(estimated.stdout)
    assert e["breakdown"]["optimizer_slots_bytes"] > 50 * 2**20  # the legacy SGD's momentum
    assert 0.7 < e["peak_bytes"] / m["peak_bytes"] < 1.4, (e["peak_bytes"], m["peak_bytes"])


@pytest.mark.slow
def test_a_batch_over_the_budget_is_a_real_oom(od_data: str) -> None:
    proc = run_cli(
        "measure",
        TASK,
        "-b",
        "4",
        *small(od_data),
        "--memory",
        "250MiB",
        "--json",
        env=env(od_data),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["oom"] is True and result["peak_bytes"] > 150 * 2**20


def test_a_module_path_names_the_experiment(od_data: str) -> None:
    proc = run_cli(
        "estimate",
        "garden:garden_tasks:experiment",
        "-b",
        "2",
        "--samples",
        "0",
        "--json",
        env=env(od_data),
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["peak_bytes"] > 200 * 2**20


@pytest.mark.parametrize(
    ("model", "extra", "words"),
    [
        ("garden:retinanet_resnet", [], "close names: retinanet_resnetfpn_coco"),
        (TASK, ["--set", "task.model.no_such_key=3"], "does not apply"),
        (TASK, ["--set", "task.model.input_size"], "key.path=value"),
        ("garden:garden_tasks:not_a_config", [], "not a Model Garden ExperimentConfig"),
        ("garden_tasks:experiment", [], "garden:garden_tasks:experiment"),
        ("garden_tasks:tf_keras_model", [], "tf_keras (Keras 2)"),
    ],
)
def test_bad_input_is_one_line(od_data: str, model: str, extra: list[str], words: str) -> None:
    proc = run_cli("estimate", model, "-b", "2", *extra, env=env(od_data))
    assert words in one_line(proc)


def test_batch_refuses_a_task_naming_what_to_use(od_data: str) -> None:
    line = one_line(run_cli("batch", TASK, *small(od_data), env=env(od_data)))
    assert "memfit measure" in line and "GuardedStep.from_task" in line


def test_a_tf_keras_step_fn_in_process_is_measured_and_estimated() -> None:
    out = run_isolated(
        """
        import memfit
        memfit.emulate("1GiB")
        import tensorflow as tf, tf_keras
        model = tf_keras.Sequential([tf_keras.Input((32, 32, 3)), tf_keras.layers.Conv2D(8, 3),
                                     tf_keras.layers.Flatten(), tf_keras.layers.Dense(4)])
        optimizer = tf_keras.optimizers.legacy.Adam()
        loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        def step_fn(data, optimizer):
            x, y = data
            with tf.GradientTape() as tape:
                value = loss(y, model(x, training=True))
            grads = tape.gradient(value, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return {"loss": value}
        samples = tf.data.Dataset.from_tensor_slices(
            (tf.random.normal((64, 32, 32, 3)), tf.zeros((64,), tf.int32)))
        before = [v.numpy().copy() for v in model.variables]
        m = memfit.measure(model, 16, optimizer=optimizer, step_fn=step_fn, data=samples)
        e = memfit.estimate(model, 16, optimizer=optimizer, step_fn=step_fn, data=samples,
                            samples=0)
        same = all((a == b.numpy()).all() for a, b in zip(before, model.variables))
        emit({"peak": m.peak_bytes, "resident": m.resident_bytes, "estimate": e.peak_bytes,
              "restored": bool(same), "iterations": int(optimizer.iterations.numpy())})
        """
    )
    assert out["restored"] and out["iterations"] == 0  # the steps measured were put back
    assert out["peak"] > out["resident"] > 0
    assert 0.7 < out["estimate"] / out["peak"] < 1.4, out
