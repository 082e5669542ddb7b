"""Named GPU cards: how much memory each has, and how much of it TensorFlow gives training."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from memfit.errors import UnknownDeviceError

MIB = 1024**2


@dataclass(frozen=True)
class Card:
    """One GPU model: its memory and the share TensorFlow hands to training.

    Attributes:
        name: memfit's name for the card, as accepted by `--device`.
        total_bytes: memory the driver reports (`nvidia-smi --query-gpu=memory.total`).
        usable_bytes: what TensorFlow's GPU allocator gets by default on that card: the total
            less the CUDA context and TensorFlow's own reserve (`MinSystemMemory` in
            `tensorflow/core/common_runtime/gpu/gpu_device.cc`: 1050 MiB for compute capability
            7.x, 1536 MiB for 8.x, 1800 MiB for 9.x and newer on cards with 2 GiB or more).
        compute_capability: CUDA compute capability, which decides TensorFlow's reserve and
            whether bfloat16 runs natively (8.0 and newer).
        usable_source: where `usable_bytes` comes from.
    """

    name: str
    total_bytes: int
    usable_bytes: int
    compute_capability: tuple[int, int]
    usable_source: str

    @property
    def reserved_bytes(self) -> int:
        """Memory on the card that training never sees (CUDA context + TensorFlow reserve)."""
        return self.total_bytes - self.usable_bytes

    @property
    def supports_bfloat16(self) -> bool:
        """Whether the card runs bfloat16 math natively (Ampere and newer)."""
        return self.compute_capability >= (8, 0)


_TF_LOG = "TensorFlow's 'Created device ... with N MB memory' log line on this card"

# Totals: nvidia-smi's memory.total in MiB as printed for each card. Usable: the lowest figure
# TensorFlow 2.6-2.18 printed in its 'Created device /job:localhost/.../GPU:0 with N MB memory'
# log line (N is in MiB) in public training logs we read, so memfit errs on the safe side;
# the spread across drivers/CUDA versions is noted per card. A10G has no public log we could
# find: its figure is the total less TensorFlow's 1536 MiB reserve for compute capability 8.x
# less a 600 MiB CUDA context (the context the RTX 3090, also 8.6, shows in its logs).
CARDS: dict[str, Card] = {
    card.name: card
    for card in (
        # T4 (Turing, 7.5): logs show 13949 MB (Colab, TF 2.15-2.17).
        Card("T4", 15360 * MIB, 13949 * MIB, (7, 5), _TF_LOG),
        # L4 (Ada, 8.9): logs show 20549-20967 MB.
        Card("L4", 23034 * MIB, 20549 * MIB, (8, 9), _TF_LOG),
        # V100 SXM2 16 GB (Volta, 7.0): logs show 14648-14988 MB.
        Card("V100-16GB", 16160 * MIB, 14648 * MIB, (7, 0), _TF_LOG),
        # V100 SXM2 32 GB: logs show 30976-31134 MB (TF 2.6-2.16).
        Card("V100-32GB", 32510 * MIB, 30976 * MIB, (7, 0), _TF_LOG),
        # A10G (AWS g5, Ampere 8.6): computed, see above.
        Card(
            "A10G",
            23028 * MIB,
            (23028 - 1536 - 600) * MIB,
            (8, 6),
            "computed: total - 1536 MiB TensorFlow reserve - 600 MiB CUDA context",
        ),
        # A100 40 GB (8.0): logs show 38068-38482 MB.
        Card("A100-40GB", 40960 * MIB, 38068 * MIB, (8, 0), _TF_LOG),
        # A100 80 GB (8.0): logs show 78945-79261 MB.
        Card("A100-80GB", 81920 * MIB, 78945 * MIB, (8, 0), _TF_LOG),
        # H100 80 GB HBM3 (Hopper, 9.0): a log shows 78763 MB.
        Card("H100-80GB", 81559 * MIB, 78763 * MIB, (9, 0), _TF_LOG),
        # GeForce RTX 3090 (8.6): logs show 22289-22455 MB.
        Card("RTX-3090", 24576 * MIB, 22289 * MIB, (8, 6), _TF_LOG),
        # GeForce RTX 4090 (8.9): logs show 21286-22288 MB (less when it also drives a display).
        Card("RTX-4090", 24564 * MIB, 21286 * MIB, (8, 9), _TF_LOG),
    )
}

_ALIASES = {
    "TESLAT4": "T4",
    "V100": "V100-16GB",
    "V10016GB": "V100-16GB",
    "V10032GB": "V100-32GB",
    "A100": "A100-40GB",
    "A10040GB": "A100-40GB",
    "A10080GB": "A100-80GB",
    "H100": "H100-80GB",
    "H10080GB": "H100-80GB",
    "RTX3090": "RTX-3090",
    "3090": "RTX-3090",
    "RTX4090": "RTX-4090",
    "4090": "RTX-4090",
}


def _key(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def get_card(name: str) -> Card:
    """Look a card up by name, forgiving case, spaces and dashes (`"a100 40gb"`, `"rtx4090"`).

    Args:
        name: a card name such as `"T4"`, `"A100-40GB"` or `"RTX-4090"`.

    Raises:
        UnknownDeviceError: the card is not known; the message lists the known cards.

    Example:
        >>> get_card("t4").name
        'T4'
    """
    key = _key(name)
    by_key = {_key(card_name): card for card_name, card in CARDS.items()}
    if key in by_key:
        return by_key[key]
    if key in _ALIASES:
        return CARDS[_ALIASES[key]]
    close = difflib.get_close_matches(name.upper(), list(CARDS), n=1)
    hint = f" Did you mean {close[0]}?" if close else ""
    raise UnknownDeviceError(
        f"unknown device {name!r}: known cards are {', '.join(CARDS)}.{hint} "
        f"For another card give its memory instead, e.g. --memory 12GiB"
    )
