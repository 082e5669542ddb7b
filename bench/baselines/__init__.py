"""Re-implementations of the batch-size finders people use today, driven by a trial function.

Each finder takes `runs(batch_size) -> bool` (True when that many samples train for the
finder's number of steps without running out of memory) and returns the size it settles on.
"""

from bench.baselines.accelerate import find_executable_batch_size
from bench.baselines.lightning import binsearch_scaling, power_scaling

__all__ = ["binsearch_scaling", "find_executable_batch_size", "power_scaling"]
