import psutil
import pytest

from memfit import Budget, MemfitError
from memfit.budget.budget import as_budget, resolve_budget


def test_from_size_is_exact():
    budget = Budget.from_size("1.5GiB")
    assert budget.usable_bytes == int(1.5 * 1024**3)
    assert budget.source == "user"


def test_from_card_uses_the_usable_share():
    budget = Budget.from_card("T4")
    assert budget.usable_bytes == 13949 * 2**20
    assert budget.total_bytes == 15360 * 2**20
    assert budget.source == "card"
    assert "CUDA context" in budget.notes[0]


def test_cpu_device_budget_is_available_host_ram():
    budget = Budget.from_device("CPU:0")
    available = psutil.virtual_memory().available
    assert budget.device == "CPU:0"
    assert abs(budget.usable_bytes - available) < 0.2 * available
    assert budget.total_bytes == psutil.virtual_memory().total


def test_resolve_budget_from_options():
    assert resolve_budget() is None
    assert resolve_budget(memory="2GiB").usable_bytes == 2 * 1024**3
    assert resolve_budget(device="A100-40GB").name == "A100-40GB"
    with pytest.raises(MemfitError, match="not both"):
        resolve_budget(memory="2GiB", device="T4")


def test_as_budget_takes_sizes_cards_and_budgets():
    b = Budget.from_size(1024)
    assert as_budget(b) is b
    assert as_budget("T4").name == "T4"
    assert as_budget("512MiB").usable_bytes == 512 * 2**20
    assert as_budget(None) is None


def test_budget_json_has_bytes():
    data = Budget.from_card("L4").to_dict()
    assert data["usable_bytes"] > 0 and data["total_bytes"] > data["usable_bytes"]
