"""What every section of a training study's report reads: the runs (workbench.recipes.train.runs),
their learned-at-all gates (gates), their verdicts (verdicts), the report's other inputs and
where its figures go."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from workbench.recipes.train.gates import Gates
from workbench.recipes.train.runs import TrainInputs, TrainRuns
from workbench.recipes.train.verdicts import Verdicts


@dataclass
class TrainResults:
    """One study's results, computed once and shared by the sections that show them."""

    inputs: TrainInputs
    dest: Path  # the report's folder: figures go to dest/figures/

    @cached_property
    def runs(self) -> TrainRuns:
        return TrainRuns(self.inputs.study, self.inputs.runs, self.inputs.curves, self.inputs.tuning)

    @cached_property
    def gates(self) -> Gates:
        return Gates(self.runs)

    @cached_property
    def verdicts(self) -> Verdicts:
        return Verdicts(self.runs, self.gates)
