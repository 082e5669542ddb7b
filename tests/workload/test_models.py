"""MODEL arguments: files, factories and built-ins, and the errors users get for bad ones."""

from pathlib import Path

import pytest
from helpers import run_cli, run_isolated

from memfit import ModelLoadError
from memfit.workload.models import check_model_spec

CHILDREN = Path(__file__).resolve().parent / "children"


def test_missing_file_is_reported_without_tensorflow(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        check_model_spec(str(tmp_path / "nope.keras"))


def test_non_zip_keras_file_is_not_a_model(tmp_path):
    path = tmp_path / "model.keras"
    path.write_text("not a model")
    with pytest.raises(ModelLoadError, match="not a Keras model file"):
        check_model_spec(str(path))


def test_other_files_are_not_models(tmp_path):
    path = tmp_path / "weights.txt"
    path.write_text("1 2 3")
    with pytest.raises(ModelLoadError, match="not a Keras model file"):
        check_model_spec(str(path))


def test_malformed_factory_spec():
    with pytest.raises(ModelLoadError, match="package.module:factory"):
        check_model_spec("pkg.mod:")


def test_factories_files_and_builtins(tmp_path):
    (tmp_path / "mymodels.py").write_text(
        "import keras\n"
        "def small():\n"
        "    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])\n"
        "    m.compile('adam', 'mse')\n"
        "    return m\n"
        "def broken():\n"
        "    raise ValueError('dataset path /data/train is missing')\n"
        "def not_a_model():\n"
        "    return 42\n"
        "NUMBER = 3\n"
    )
    out = run_isolated(CHILDREN / "load_models.py", args={"directory": str(tmp_path)})
    assert out["factory"] == "Sequential"
    assert out["file"] == "Adam"
    assert out["builtin"] == [None, 7]
    assert "has no 'missing'" in out["mymodels:missing"] and "small" in out["mymodels:missing"]
    assert "raised ValueError: dataset path /data/train is missing" in out["mymodels:broken"]
    assert "not a keras.Model" in out["mymodels:not_a_model"]
    assert "not a callable" in out["mymodels:NUMBER"]
    assert "no such module" in out["nosuchmodule:f"]
    assert "MobileNetV2" in out["keras.applications.MobileNetV9"]
    assert "--unsafe" in out["lambda.keras"]
    assert out["unsafe_ok"] == "Functional"


_UNCOMPILED = (
    "import keras\n"
    "def build():\n"
    "    inputs = keras.Input((32, 32, 3))\n"
    "    h = keras.layers.Conv2D(8, 3, activation='relu')(inputs)\n"
    "    h = keras.layers.GlobalAveragePooling2D()(h)\n"
    "    return keras.Model(inputs, keras.layers.Dense(5, activation='softmax')(h))\n"
)


def test_uncompiled_model_says_which_optimizer_and_loss_were_used():
    # A new user's finding: a factory's uncompiled model was measured silently
    # with a loss and optimizer nobody chose. Built-ins are never compiled: no warning.
    result = run_isolated(CHILDREN / "uncompiled.py")
    assert len(result["warnings"]) == 1, result["warnings"]
    message = result["warnings"][0]
    assert "is not compiled" in message
    assert "optimizer 'adam' and loss 'sparse_categorical_crossentropy'" in message
    assert result["compiled_with"] == {
        "optimizer": "adam",
        "loss": "sparse_categorical_crossentropy",
    }
    assert result["builtin"]["optimizer"] == "adam"  # chosen too, and recorded
    assert result["given"] is None  # both given: nothing chosen


def test_cli_warns_once_when_a_factory_returns_an_uncompiled_model(tmp_path):
    (tmp_path / "uncompiled.py").write_text(_UNCOMPILED)
    proc = run_cli(
        "measure",
        "uncompiled:build",
        "--batch-size",
        "2",
        "--repeats",
        "1",
        "--memory",
        "256MiB",
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    warned = [line for line in proc.stderr.splitlines() if "is not compiled" in line]
    assert len(warned) == 1, proc.stderr[-2000:]
    assert warned[0].startswith("memfit: warning: model ")
    assert "optimizer 'adam' and loss 'sparse_categorical_crossentropy'" in warned[0]
