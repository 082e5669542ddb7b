"""Emulated budgets give real ResourceExhaustedErrors; each case runs in its own process."""

from pathlib import Path

from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"


def test_emulate_caps_cpu_memory_with_a_real_oom():
    result = run_isolated(CHILDREN / "cpu_oom.py")
    assert result["outcome"] == "oom"
    assert result["bytes"] == 64 * 2**20
    assert result["source"] == "emulated"
    assert result["peak"] <= 64 * 2**20


def test_emulate_a_named_card():
    result = run_isolated(CHILDREN / "named_card.py")
    assert result["name"] == "T4"
    assert result["bytes"] == 13949 * 2**20
    assert result["limit_mb"] == "13949"
    assert result["onednn"] == "0"


def test_environment_variable_emulates_on_import():
    result = run_isolated(
        CHILDREN / "env_budget.py",
        env={"MEMFIT_MEMORY": "100MiB"},
    )
    assert result == {"outcome": "oom", "budget": 100 * 2**20}


def test_emulate_after_tensorflow_initialised_says_so():
    result = run_isolated(CHILDREN / "too_late.py")
    assert result["raised"] is not None
    assert "already initialised" in result["raised"]
    assert "MEMFIT_MEMORY=1GiB" in result["raised"]


def test_emulate_after_import_but_before_init_still_caps():
    result = run_isolated(CHILDREN / "before_init.py")
    assert result == "oom"


_REGIONS = CHILDREN / "regions.py"


def test_emulated_card_is_one_region_like_a_gpu_without_memory_growth():
    # 100 MiB then, once freed, 200 MiB under 256 MiB: one region serves both, as a GPU
    # with memory growth off does.
    result = run_isolated(_REGIONS, args={"growth": False})
    assert result == {"outcome": "allocated", "growth": "0"}


def test_memory_growth_emulates_regions_that_never_merge():
    # With growth the first request made a 128 MiB region; the second needs 200 MiB and only
    # 126 MiB are left to grow into: a real OOM, as on a GPU with set_memory_growth(True).
    result = run_isolated(_REGIONS, args={"growth": True})
    assert result == {"outcome": "oom", "growth": "1"}


def test_memory_growth_without_a_budget_on_a_cpu_is_one_clear_error():
    from helpers import run_cli

    proc = run_cli("doctor", "--memory-growth")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("memfit: error: --memory-growth")
    assert "--memory SIZE or --device CARD" in lines[-1]
    assert "Traceback" not in proc.stderr


def test_doctor_shows_the_emulation_mode():
    from helpers import run_cli

    one = run_cli("doctor", "--memory", "512MiB", "--json")
    grows = run_cli("doctor", "--memory", "512MiB", "--memory-growth", "--json")
    import json

    assert json.loads(one.stdout)["emulated_memory_growth"] is False
    assert json.loads(grows.stdout)["emulated_memory_growth"] is True


def test_a_child_process_that_inherits_the_emulation_sets_up_its_own_region():
    # A process started from an emulating one inherits its environment (the budget, the
    # allocator's limit); it must still reserve its own one region, not take the inherited
    # variables for an emulation already applied (that child's allocator grew in regions, and
    # a size confirmed by memfit ran out of memory there).
    result = run_isolated(
        CHILDREN / "inherited.py",
        env={"MEMFIT_MEMORY": "256MiB"},
    )
    assert result == "allocated"
