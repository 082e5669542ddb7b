"""Errors a user can cause, each with a message that says what is wrong and what to do."""

from __future__ import annotations


class MemfitError(Exception):
    """Base class of every error memfit raises for something the user can fix.

    The message is one sentence (or two) saying what was wrong and what to do about it.
    The CLI prints it as a single line, `memfit: error: <message>`, and exits with status 2.
    """


class MemfitWarning(UserWarning):
    """Something the user should know that does not stop the work (the CLI: one line).

    The CLI prints it as `memfit: warning: <message>`; from a child process that measures,
    it reaches the parent the same way.
    """


class SizeError(MemfitError, ValueError):
    """A memory size string or number could not be understood or is not positive."""


class UnknownDeviceError(MemfitError, KeyError):
    """A named card is not in memfit's table of cards."""

    def __str__(self) -> str:  # KeyError would add quotes around the message
        return str(self.args[0]) if self.args else ""


class BackendMissingError(MemfitError, ImportError):
    """TensorFlow (or a TensorFlow-backed Keras) is not available in this environment."""


class EmulationError(MemfitError, RuntimeError):
    """An emulated budget cannot be applied (for example TensorFlow already initialised)."""


class ModelLoadError(MemfitError):
    """A MODEL argument (file, factory or built-in name) could not be turned into a model."""


class WorkloadError(MemfitError, ValueError):
    """A model, its inputs, targets, loss or optimizer cannot make a training step."""


class MeasurementError(MemfitError, RuntimeError):
    """Memory cannot be measured on this device in this process."""


class DataError(MemfitError, ValueError):
    """Data memfit was asked to read or audit cannot be used (no files, unknown schema, ...)."""


class RecomputeError(MemfitError, ValueError):
    """Recompute (gradient checkpointing) cannot apply to a model, or a policy is not valid."""


class BackupError(MemfitError):
    """A `backup_dir` or its checkpoint cannot be used (a file, not writable, another model)."""


class DistributedError(MemfitError, RuntimeError):
    """Workers of a multi-worker job cannot go on together: one stopped, or a collective failed."""
