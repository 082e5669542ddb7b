"""tf_keras (Keras 2) and TF Model Garden tests: run in the Model Garden's environment.

The Model Garden pins its own TensorFlow, so `make` installs it in a second environment
(`.venv-garden`) and `make test` runs this folder there; everywhere else nothing in this
folder is collected.
"""

import importlib.metadata
import importlib.util


def _tf_keras_installed() -> bool:
    # The installed distribution, not an import: the main environment must not load it.
    try:
        importlib.metadata.version("tf_keras")
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("tf_keras.src") is not None


# Not collected, so not imported: a module-level skip in a conftest is an error in pytest.
collect_ignore_glob = [] if _tf_keras_installed() else ["test_*.py"]
