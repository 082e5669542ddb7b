"""`memfit doctor` where tf_keras and the Model Garden are installed: their versions, what
TF_USE_LEGACY_KERAS does, and what memfit does with those models; tf_keras is never imported
and TensorFlow never initialised to find out."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

from helpers import run_cli, run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"


def test_doctor_names_tf_keras_and_the_model_garden_without_importing_them() -> None:
    out = run_isolated(CHILDREN / "doctor_legacy.py")
    assert out["initialised"] is False and out["imported"] == []
    version = importlib.metadata.version("tf_keras")
    plain, switched = out["plain"], out["switched"]
    assert plain["legacy_keras"]["tf_keras_version"] == version
    assert plain["legacy_keras"]["tf_use_legacy_keras"] is False
    assert plain["versions"]["tf_keras"] == version
    findings = {f["topic"]: f for f in plain["findings"]}
    assert findings["tf_keras"]["level"] == "ok" and version in findings["tf_keras"]["message"]
    assert "tf.keras is Keras 3" in findings["tf_keras"]["message"]
    garden = importlib.metadata.version("tf-models-official")
    assert plain["legacy_keras"]["model_garden_version"] == garden
    assert "GuardedStep" in findings["model garden"]["message"]
    assert plain["ok"] is True
    (warning,) = [f for f in switched["findings"] if f["topic"] == "tf_keras"]
    assert warning["level"] == "warning" and f"tf.keras is tf_keras {version}" in warning["message"]
    assert switched["legacy_keras"]["tf_use_legacy_keras"] is True and switched["ok"] is True


def test_doctor_json_and_table_show_tf_keras() -> None:
    version = importlib.metadata.version("tf_keras")
    proc = run_cli("doctor", "--json", env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["legacy_keras"]["tf_keras_version"] == version
    table = run_cli("doctor", env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert table.returncode == 0, table.stderr[-2000:]
    assert f"tf_keras {version}" in table.stdout
