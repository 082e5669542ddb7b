"""The demo's narration on a rich console: the intro, each step's lines, the summary, sizes."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from memfit.demo.job import BATCH, LARGE, SMALL, Settings
from memfit.demo.results import DemoResult, StepResult
from memfit.sizes import format_size


def intro(console: Console, settings: Settings) -> None:
    """The panel that says what the demo trains, on what, under which card."""
    s = settings
    console.print(
        Panel(
            f"A keras-hub RetinaNet (ResNet-10 encoder, built from config, random weights) "
            f"trains on detection data: {s.small_images} images of {SMALL}x{SMALL}, then "
            f"a new shard of {s.large_images} at {LARGE}x{LARGE}. Batch {BATCH}, on an "
            f"emulated card of {s.memory} (CPU, TensorFlow's BFC allocator capped; real "
            f"out-of-memory errors).",
            title="memfit demo",
        )
    )


def step_header(console: Console, index: int, name: str, command: str) -> None:
    """A step's rule and the command it runs."""
    console.rule(f"[bold]{index}. {name}")
    console.print(f"[dim]$ {escape(command)}[/]")


def step_outcome(console: Console, result: StepResult) -> None:
    """Whether the step showed its claim, how long it took, and its problem if any."""
    mark = "[green]shown[/]" if result.ok else "[bold red]NOT shown[/]"
    console.print(f"{mark}: {escape(result.claim)} [dim]({result.seconds:.0f} s)[/]")
    if result.problem:
        console.print(f"[red]{escape(result.problem)}[/]")


def summary(console: Console, result: DemoResult) -> None:
    """Every step's verdict, then the demo's."""
    console.rule("[bold]summary")
    for index, s in enumerate(result.steps, 1):
        mark = "[green]ok[/]  " if s.ok else "[bold red]FAIL[/]"
        console.print(f"{mark} {index}. {escape(s.claim)} [dim]({s.seconds:.0f} s)[/]")
    verdict = "every step showed what it claims" if result.ok else "some steps failed"
    console.print(
        f"[bold]{verdict}[/] in {result.seconds / 60:.1f} min"
        + (f"; report: {result.report_path}" if result.report_path else "")
    )


def outcome_text(outcome: dict[str, Any]) -> str:
    """` — MESSAGE` of a training outcome, cut to 160 characters ("" without one)."""
    return f" — {outcome['message'][:160]}" if outcome.get("message") else ""


def size_text(value: Any) -> str:
    """A byte count as memfit writes sizes; `?` when there is none."""

    return format_size(int(value)) if isinstance(value, (int, float)) else "?"
