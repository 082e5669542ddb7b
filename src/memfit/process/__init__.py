"""Process: run a function of memfit in a fresh Python child process and read its answer.

`run_in_child(function, kwargs)` calls a function once in a fresh process; `ChildWorker` keeps
one serving calls. Each feature keeps the functions its child processes run in its own
`child` module (`memfit.measuring.child`, `memfit.search.child`, ...).
"""

from memfit.process.runner import ChildWorker, entry_name, run_in_child

__all__ = ["ChildWorker", "entry_name", "run_in_child"]
