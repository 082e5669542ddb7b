"""docs/api.md lists every public name of `memfit` with its signature, as the code has it.

Regenerate the page's signature blocks after changing a public signature:
`python tests/test_api_page.py --write` (the prose around them is kept).
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import memfit
import memfit.data

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"
BLOCK = re.compile(r"(<!-- signatures: (?P<name>[\w.]+) -->\n```python\n)(?P<body>.*?)(```)", re.S)


def _signature(owner: object, name: str) -> str:
    value = getattr(owner, name)
    prefix = f"{owner.__name__}.{name}"
    if inspect.isclass(value):
        if issubclass(value, BaseException):
            return f"class {prefix}({value.__mro__[1].__name__})"
        try:
            signature = inspect.signature(value)
        except (TypeError, ValueError):
            return f"class {prefix}"
        return f"class {prefix}{_text(signature)}"
    if callable(value):
        return f"{prefix}{_text(inspect.signature(value))}"
    if inspect.ismodule(value):
        return f"{prefix}  # module"
    return f"{prefix}: {type(value).__name__}"


def _text(signature: inspect.Signature) -> str:
    # Annotations as written (`from __future__ import annotations` keeps them strings).
    text = str(signature.replace(return_annotation=inspect.Signature.empty))
    return text.replace("'", "")


def blocks() -> dict[str, str]:
    """The signature block of each documented namespace, made from the code."""
    out = {}
    for module in (memfit, memfit.data):
        names = [name for name in sorted(module.__all__, key=str.lower) if name != "data"]
        out[module.__name__] = "".join(f"{_signature(module, name)}\n" for name in names)
    return out


def test_the_api_page_lists_every_public_signature() -> None:
    page = PAGE.read_text()
    found = {m["name"]: m["body"] for m in BLOCK.finditer(page)}
    expected = blocks()
    assert found.keys() == expected.keys()
    for name, body in expected.items():
        assert found[name] == body, (
            f"docs/api.md's {name} signatures differ from the code: run "
            f"`python tests/test_api_page.py --write`"
        )


def test_the_analyses_share_one_convention() -> None:
    # budget, progress and the workload's arguments by name, the same way in each.
    for function in (memfit.measure, memfit.estimate, memfit.find_batch_size, memfit.plan):
        parameters = inspect.signature(function).parameters
        for name in ("budget", "progress", "data", "input_shape", "optimizer", "loss"):
            assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, (function, name)
    assert inspect.signature(memfit.fit).parameters["budget"].kind is inspect.Parameter.KEYWORD_ONLY


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    expected = blocks()
    PAGE.write_text(
        BLOCK.sub(lambda m: m.group(1) + expected[m["name"]] + m.group(4), PAGE.read_text())
    )
