"""memfit without TensorFlow: imports, and says which extra to install when TF is needed."""

from helpers import run_isolated


def test_import_without_tensorflow_names_the_extra():
    out = run_isolated(
        """
        import sys
        sys.modules["tensorflow"] = None            # as if TensorFlow were not installed
        import memfit
        print(memfit.parse_size("1GiB"))
        try:
            memfit.emulate("1GiB")
            from memfit.backend import tf as tfb
            tfb.import_tf()
            emit(None)
        except memfit.BackendMissingError as exc:
            emit(str(exc))
        """
    )
    assert out is not None
    assert 'pip install "memfit[cpu]"' in out and "memfit[gpu]" in out
