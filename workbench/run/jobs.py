"""A job: what an executor hands to the process that trains it. Its own module because both sides
import it: the executors that send jobs and the training code (workbench.run.train,
workbench.run.batched) that executes them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.results import RunResult, Status


@dataclass(frozen=True)
class Job:
    """One run to execute: plain, picklable data. `together`: runs trained with it, which differ
    from it only in how they evaluate (workbench.recipes.train.sweep.training_groups); `batch`:
    other seeds of its sweep point trained with it as one batched model (`train.batch_seeds`,
    workbench.run.batched), each with its own `together`. The job yields a result for each run."""

    run_id: str
    config: dict[str, Any]
    run_dir: Path
    tracker: Any = None  # workbench.run.tracking.TrackerRun: the run's name in an experiment tracker
    together: tuple[Job, ...] = ()
    batch: tuple[Job, ...] = ()

    @property
    def with_siblings(self) -> tuple[Job, ...]:
        """Its run and the runs that share its training."""
        return (self, *self.together)

    @property
    def runs(self) -> tuple[Job, ...]:
        return (*self.with_siblings, *(run for member in self.batch for run in member.with_siblings))

    def results(self, outcome: RunResult | list[RunResult]) -> list[RunResult]:
        """What executing it returned, as one result per run."""
        return outcome if isinstance(outcome, list) else [outcome]

    def failed(self, status: Status, error: str) -> list[RunResult]:
        """Every run of the job with the same failure (the process that trained them died)."""
        return [RunResult(run.run_id, status, error=error) for run in self.runs]
