"""The public docstring examples: collect them, and run them in a child process.

`collect()` finds the "Example:" section of every name in `memfit.__all__` and of the public
methods and properties a public class defines itself, as `Example`s: `>>>` doctests (their
shown output is checked) or ```python blocks (they must run). Run as a script,
`python docstring_examples.py RESULTS.json KEY NAME...` runs the named examples in this
process, in order, each in a fresh namespace (`namespace`), and writes each one's outcome to
RESULTS.json.

The examples use a few names they do not define, as a user's code has them. `namespace` gives
each example those placeholders, freshly built:

- `memfit`, `keras`, `tf`, `np`: the modules.
- `model`: a small compiled CNN (10 softmax classes) for RGB images of any size.
- `build_model()`: builds and compiles a small CNN for 32x32 RGB images in 10 classes.
- `x`, `y`: 256 images 32x32x3 (float32) and their integer labels (0-9).
- `train_ds`, `dataset`: a `tf.data.Dataset` of the same, in batches of 32; `val_ds`: 64 more.
- `watch`: a `memfit.Watch` that watched one epoch of `model.fit` on `train_ds`.
- `optimizer`, `loss`: a Keras Adam optimizer and sparse categorical cross-entropy.
- `mypkg`: the user's package, whose `mypkg.models:build` is a tiny model factory (in
  tests/mypkg/, importable by memfit's child processes through PYTHONPATH).

and the globals of the module that defines the example's object, as `doctest` does.

Emulation (`memfit.emulate`) is fixed for a process once TensorFlow initialises, so examples
that emulate a budget run in a process of their own per budget (`emulation_key`), which
emulates it before the first example runs (each example's own call then changes nothing).
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import inspect
import io
import json
import re
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEADING = re.compile(r"^(?P<indent>[ \t]*)Examples?:[ \t]*$", re.M)
FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(?P<code>.*?)```", re.S)
EMULATE = re.compile(r"memfit\.emulate\((?P<args>[^)]*)\)")


@dataclass(frozen=True)
class Example:
    """One public docstring example: the object's public name and the section's text."""

    name: str  # "fit", "Plan.build_scope"
    module: str  # the module that defines the object (its globals are the example's)
    text: str  # the section's body, dedented

    @property
    def is_doctest(self) -> bool:
        return ">>>" in self.text

    @property
    def code(self) -> str:
        """The example's Python source (a doctest's statements, or the fenced blocks)."""
        if self.is_doctest:
            parsed = doctest.DocTestParser().get_examples(self.text)
            return "".join(example.source for example in parsed)
        blocks = [match.group("code") for match in FENCE.finditer(self.text)]
        return "\n".join(blocks) if blocks else self.text


def example_section(doc: str | None) -> str | None:
    """The body of a docstring's "Example:" section, dedented, or None without one."""
    if not doc:
        return None
    doc = inspect.cleandoc(doc)
    match = HEADING.search(doc)
    if match is None:
        return None
    indent = len(match.group("indent").expandtabs())
    body: list[str] = []
    for line in doc[match.end() :].splitlines()[1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break  # the next section (Returns:, Raises:, ...) or the end of the docstring
        body.append(line)
    text = inspect.cleandoc("\n".join(body))
    return text or None


def public_objects() -> Iterator[tuple[str, Any]]:
    """Every name in `memfit.__all__`, and the public members its classes define themselves."""
    import memfit

    for name in memfit.__all__:
        obj = getattr(memfit, name)
        yield name, obj
        if not inspect.isclass(obj):
            continue
        for attr, member in vars(obj).items():
            if attr.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            elif isinstance(member, property):
                member = member.fget
            if inspect.isroutine(member):
                yield f"{name}.{attr}", member


def readme_examples() -> list[Example]:
    """The README's ```python blocks, each named `README <its section>`.

    The "Python API" section's block is left out: tests/test_readme.py runs it as it stands,
    in a terminal, because it defines all it uses.
    """
    readme = Path(__file__).resolve().parents[1] / "README.md"
    examples, section = [], ""
    for match in re.finditer(
        r"^(#+ [^\n]*)$|^```python\n(.*?)^```", readme.read_text(), re.S | re.M
    ):
        if match.group(1):
            section = match.group(1).lstrip("# ").strip()
        elif section != "Python API":
            name = f"README {section}"
            examples.append(Example(name, "memfit", f"```python\n{match.group(2)}```"))
    return examples


def collect() -> list[Example]:
    """The Example section of every public object (its own docstring, not one inherited),
    then the README's examples (`readme_examples`)."""
    examples = []
    for name, obj in public_objects():
        text = example_section(getattr(obj, "__doc__", None))
        if text is None:
            continue
        module = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", "memfit")
        examples.append(Example(name, module or "memfit", text))
    return examples + readme_examples()


def emulation_key(example: Example) -> str:
    """The budget an example emulates (its first `memfit.emulate(...)` arguments), or ""."""
    match = EMULATE.search(example.code)
    return match.group("args").strip() if match else ""


def build_model(input_shape: tuple[Any, ...] = (32, 32, 3)) -> Any:
    """A small compiled CNN for RGB images (32x32 by default) in 10 classes."""
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input(input_shape)
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(h))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def samples(n: int, seed: int) -> tuple[Any, Any]:
    """`n` random 32x32 RGB images (float32) and integer labels 0-9."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.random((n, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


def batches(n: int, seed: int) -> Any:
    """A `tf.data.Dataset` of `samples(n, seed)` in batches of 32."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(samples(n, seed)).batch(32)


def watched() -> Any:
    """A `memfit.Watch` that watched one epoch of training (its `findings` filled in)."""
    import memfit

    watch = memfit.Watch(log_path=None)
    build_model((None, None, 3)).fit(batches(256, 0), epochs=1, callbacks=[watch], verbose=0)
    return watch


def _module(name: str) -> Any:
    import importlib

    return importlib.import_module(name)


# The names the examples use without defining them (see the module docstring): each built
# afresh for each example that reads it without binding it, and only then (cheaper, and an
# example's own `model = ...` is what it builds).
PLACEHOLDERS: dict[str, Any] = {
    "memfit": lambda: _module("memfit"),
    "keras": lambda: _module("keras"),
    "tf": lambda: _module("tensorflow"),
    "np": lambda: _module("numpy"),
    "mypkg": lambda: _module("mypkg.models") and _module("mypkg"),
    "build_model": lambda: build_model,
    "model": lambda: build_model((None, None, 3)),
    "x": lambda: samples(256, 0)[0],
    "y": lambda: samples(256, 0)[1],
    "train_ds": lambda: batches(256, 0),
    "dataset": lambda: batches(256, 0),
    "val_ds": lambda: batches(64, 1),
    "watch": watched,
    "optimizer": lambda: _module("keras").optimizers.Adam(1e-3),
    "loss": lambda: _module("keras").losses.SparseCategoricalCrossentropy(),
}


def free_names(code: str) -> set[str]:
    """The names `code` reads but never binds itself (those a placeholder must supply)."""
    nodes = [node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name)]
    bound = {node.id for node in nodes if not isinstance(node.ctx, ast.Load)}
    bound |= {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(ast.parse(code))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    return {node.id for node in nodes if isinstance(node.ctx, ast.Load)} - bound


def namespace(example: Example) -> dict[str, Any]:
    """A fresh namespace for one example: its module's globals, then the placeholders it uses."""
    names = dict(vars(_module(example.module)))
    for name in sorted(free_names(example.code) & PLACEHOLDERS.keys()):
        names[name] = PLACEHOLDERS[name]()
    names["__name__"] = "__example__"
    return names


def run_example(example: Example) -> dict[str, Any]:
    """Run one example; its outcome: ok, the error (a traceback or a doctest's report), time."""
    started = time.perf_counter()
    out = io.StringIO()
    error = ""
    try:
        names = namespace(example)
        if example.is_doctest:
            test = doctest.DocTestParser().get_doctest(
                example.text, names, example.name, example.module, 0
            )
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
            runner.run(test, out=out.write, clear_globs=False)
            if runner.failures:
                error = out.getvalue()
        else:
            with contextlib.redirect_stdout(out):
                exec(compile(example.code, f"<{example.name} example>", "exec"), names)
    except BaseException:  # noqa: BLE001 - an example's failure is a result to report
        error = traceback.format_exc()
    return {
        "ok": not error,
        "error": error,
        "output": out.getvalue()[-2000:],
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str]) -> int:
    """`RESULTS.json KEY NAME...`: run the named examples, which all emulate KEY (or none)."""
    results_path, key, wanted = argv[0], argv[1], argv[2:]
    import memfit

    if key:  # what each of these examples does first thing, before TensorFlow initialises
        eval(f"memfit.emulate({key})", {"memfit": memfit})
    by_name = {example.name: example for example in collect()}
    results: dict[str, Any] = {}
    for name in wanted:
        example = by_name[name]
        assert emulation_key(example) == key, f"{name} emulates {emulation_key(example)}"
        results[name] = run_example(example)
        with open(results_path, "w") as file:  # after each: a crash keeps the ones before
            json.dump(results, file, indent=1)
        status = "ok" if results[name]["ok"] else "FAILED"
        print(f"example {name}: {status} ({results[name]['seconds']} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
