"""`python -m workbench.run.one_run RUN_DIR RUN_ID [TRACKER_JSON]`: one rank of a run that trains on several
processes (workbench.run.distributed starts rank 0; Lightning starts the others with the same
command). Trains the run of RUN_DIR/config.json; rank 0 writes its result. Exit 130 when stopped."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from workbench import stopping
from workbench.results import CONFIG_FILE
from workbench.run.tracking import TrackerRun
from workbench.run.train import train_here


def main(argv: list[str]) -> int:
    run_dir, run_id = Path(argv[0]), argv[1]
    config = json.loads((run_dir / CONFIG_FILE).read_text())
    tracker = TrackerRun(**json.loads(argv[2])) if len(argv) > 2 else None
    stopping.install_handlers()  # SIGTERM from the worker: the ranks agree on a step and checkpoint it
    try:
        train_here(run_id, config, run_dir, tracker)
    except stopping.RunInterrupted:
        return stopping.RunInterrupted.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
