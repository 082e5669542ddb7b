"""`memfit.estimation.bfc.BFC`: the raced peak, worked out only where it can rise."""

from __future__ import annotations

import random

from memfit.estimation.bfc import BFC


class _Always(BFC):
    """A BFC that works out the raced slack at every allocation (no bound skips it)."""

    def _slack_bound(self) -> int:
        return 1 << 62


def test_the_raced_peak_is_the_same_as_working_it_out_at_every_allocation():
    for seed in range(20):
        rng = random.Random(seed)
        region = None if seed % 2 else 64 << 20
        pair = (BFC(region), _Always(region))
        live: list[tuple[int, int]] = []
        for _ in range(400):
            if live and rng.random() < 0.45:
                handles = live.pop(rng.randrange(len(live)))
                for bfc, handle in zip(pair, handles, strict=True):
                    bfc.free(handle)
            else:
                nbytes = rng.choice((1, 3, 5, 9, 17)) * rng.randrange(1, 1 << 18)
                live.append(tuple(bfc.allocate(nbytes) for bfc in pair))
            if rng.random() < 0.05:
                for bfc in pair:
                    bfc.reset_peak()
            fast, slow = pair
            assert (fast.in_use, fast.peak, fast.raced_peak) == (
                slow.in_use,
                slow.peak,
                slow.raced_peak,
            ), seed
        assert pair[1].raced_peak > pair[1].peak  # the sequence did race for larger holes
