"""tf_keras (Keras 2) tests: run with an environment that has tf_keras (the Model Garden's).

`PYTHONPATH=src python -m pytest -q tests/tf_keras` there; everywhere else nothing in this
folder is collected. Run the folder on its own: its `test_watch.py` and `test_doctor.py`
share their basenames with tests in `tests/`, and pytest's default import mode would take
them for one module.
"""

import importlib.metadata
import importlib.util


def _tf_keras_installed() -> bool:
    # The installed distribution, not `import tf_keras` alone: with `tests/` on sys.path (the
    # top conftest puts it there) this folder itself imports as a namespace package `tf_keras`.
    try:
        importlib.metadata.version("tf_keras")
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("tf_keras.src") is not None


# Not collected, so not imported: a module-level skip in a conftest is an error in pytest.
collect_ignore_glob = [] if _tf_keras_installed() else ["test_*.py"]
