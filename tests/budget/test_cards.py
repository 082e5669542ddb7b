import pytest

from memfit import CARDS, UnknownDeviceError, get_card

REQUIRED = [
    "T4",
    "L4",
    "V100-16GB",
    "V100-32GB",
    "A10G",
    "A100-40GB",
    "A100-80GB",
    "H100-80GB",
    "RTX-3090",
    "RTX-4090",
]


def test_all_required_cards_are_known():
    assert set(REQUIRED) <= set(CARDS)


@pytest.mark.parametrize("name", REQUIRED)
def test_usable_share_is_below_total_by_a_plausible_reserve(name):
    card = CARDS[name]
    # CUDA context + TensorFlow's reserve: at least TF's 1050 MiB minimum for >= 2 GiB cards,
    # never more than a tenth of a big card plus its reserve.
    assert 1050 * 2**20 <= card.reserved_bytes <= 0.1 * card.total_bytes + 1800 * 2**20
    assert 0 < card.usable_bytes < card.total_bytes


@pytest.mark.parametrize(
    ("alias", "name"),
    [("t4", "T4"), ("a100 40gb", "A100-40GB"), ("RTX4090", "RTX-4090"), ("h100", "H100-80GB")],
)
def test_lookup_forgives_spelling(alias, name):
    assert get_card(alias).name == name


def test_unknown_card_lists_the_known_ones():
    with pytest.raises(UnknownDeviceError) as info:
        get_card("NotACard")
    message = str(info.value)
    assert all(name in message for name in REQUIRED)
    assert "--memory" in message


def test_bfloat16_support_follows_compute_capability():
    assert CARDS["A100-40GB"].supports_bfloat16
    assert not CARDS["T4"].supports_bfloat16
