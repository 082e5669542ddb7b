"""What a test's child script imports: `emit`, which sends one result back to the test, and
`arguments`, the parameters the test gave it.

A child script (a file under a `children/` folder of `tests/`) runs in a fresh Python process
through `helpers.run_isolated(path, args=...)`, with `tests/` on its path.
"""

from __future__ import annotations

import json
import sys
from typing import Any

RESULT_MARK = "MEMFIT-TEST-RESULT:"


def emit(obj: Any) -> None:
    """Send `obj` (JSON-serialisable) back to the test that started this process."""
    print(RESULT_MARK + json.dumps(obj), flush=True)


def arguments() -> dict[str, Any]:
    """The parameters the test passed (`run_isolated(path, args={...})`); {} without any."""
    return json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
