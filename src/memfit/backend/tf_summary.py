"""TensorBoard scalars written with TensorFlow alone (no `tensorboard` package)."""

from __future__ import annotations

from typing import Any

from memfit.backend.tf_import import import_tf


class ScalarWriter:
    """TensorBoard scalars written to one log folder, a whole series per call.

    `tf.summary.scalar` needs the `tensorboard` package; this writes the same records (scalar
    tensors tagged for TensorBoard's scalars plugin) with TensorFlow alone. One eager
    `tf.summary.write` costs ~0.6 ms, which per step and per series would be several times a
    small model's step; here each series goes through one compiled loop instead.

    Args:
        log_dir: the folder TensorBoard reads (created when missing).
    """

    def __init__(self, log_dir: str) -> None:
        tf = import_tf()
        self._writer = tf.summary.create_file_writer(log_dir)
        metadata = tf.compat.v1.SummaryMetadata(
            plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
        ).SerializeToString()
        writer = self._writer

        @tf.function(
            input_signature=[
                tf.TensorSpec([], tf.string),
                tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.float32),
            ]
        )
        def series(tag: Any, steps: Any, values: Any) -> None:
            with writer.as_default():
                for i in tf.range(tf.shape(values)[0]):
                    tf.summary.write(tag, values[i], step=steps[i], metadata=metadata)

        self._series = series

    def write(self, tag: str, steps: list[int], values: list[float]) -> None:
        """Write `values` of `tag` at `steps` (one record each)."""
        if steps:
            self._series(tag, steps, values)

    def flush(self) -> None:
        """Push what was written to disk."""
        self._writer.flush()
