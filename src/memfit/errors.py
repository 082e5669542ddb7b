"""Errors a user can cause, each with a message that says what is wrong and what to do."""

from __future__ import annotations

import re


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


def one_line(exc: BaseException) -> str:
    """The gist of an exception from a model's code as one clean line, `Type: message`.

    Keras and TensorFlow errors span many lines: ANSI colours, "Graph execution error",
    the layer that raised ("Exception encountered when calling X.call()") then the cause, the
    node's definition and the arguments the layer received. This keeps the layer and the
    cause, so a failure inside a user's model can be shown as `memfit: error: ...`.

    Args:
        exc: the exception.

    Returns:
        `"<type name>: <message>"` on one line, at most about 400 characters.

    Example:
        >>> one_line(ValueError("bad value\\n  at node x"))
        'ValueError: bad value'
    """
    return f"{type(exc).__name__}: {clean_message(getattr(exc, 'message', None) or str(exc))}"


def clean_message(text: str) -> str:
    """An error message reduced to one line: see `one_line`.

    Args:
        text: the message, possibly many lines long.

    Returns:
        The first meaningful line (with the cause after a Keras layer's name), no colours,
        no node definitions, at most about 400 characters.

    Example:
        >>> clean_message("Graph execution error:\\n\\nout of range [[{{node x}}]]")
        'out of range'
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if line.rstrip(":") != "Graph execution error"]
    calling = [i for i, line in enumerate(lines) if "Exception encountered when calling" in line]
    if calling:  # Keras' layer, then the cause
        first = re.sub(r"^\w+: ", "", lines[calling[0]]).rstrip(".")
        text = f"{first}: {lines[calling[0] + 1]}" if calling[0] + 1 < len(lines) else first
    elif lines and lines[0].rstrip(":") == "in user code":  # a traced function's traceback
        raised = [line for line in lines if re.match(r"\w+(Error|Exception): ", line)]
        text = re.sub(r"^\w+: ", "", raised[-1]) if raised else lines[-1]
    else:
        text = lines[0] if lines else ""
    cuts = r"Detected at node|\s\[\[\{\{node| for '\{\{node|\. Hint:|Arguments received"
    text = re.split(cuts, text)[0]
    text = " ".join(text.split()).rstrip(" .:")
    return text if len(text) <= 400 else text[:399] + "…"
