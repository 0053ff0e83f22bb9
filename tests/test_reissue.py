"""reissue.sh (issue 64): a name that is not a study file of studies/ is refused, and the run's
folder is named after the study's `name:`, read from its file. Run from a copy of the script
beside a studies/ folder of its own, with REISSUE_BIN a `workbench` that records what it is
asked (nothing trains) and the project's own Python (which reads the study's name)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDY = """\
name: {name}
task: {{name: copy, train_length: 4, alphabet_size: 4}}
model: {{family: decoder, d_model: 16, n_layers: 1, n_heads: 2}}
train: {{steps: 2, batch_size: 4}}
"""


def reissue(tmp_path: Path, *names: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    checkout, bin_dir = tmp_path / "checkout", tmp_path / "bin"
    (checkout / "studies").mkdir(parents=True)
    bin_dir.mkdir()
    shutil.copy(ROOT / "reissue.sh", checkout / "reissue.sh")
    (checkout / "studies" / "file-name.yaml").write_text(STUDY.format(name="yaml-name"))
    (tmp_path / "evil.yaml").write_text(STUDY.format(name="evil"))
    (checkout / "studies" / "linked.yaml").symlink_to(tmp_path / "evil.yaml")
    log = tmp_path / "asked.txt"
    (bin_dir / "workbench").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    for tool in ("workbench", "python"):
        (bin_dir / tool).chmod(0o755)
    result = subprocess.run([str(checkout / "reissue.sh"), *names], capture_output=True, text=True,
                            env={**os.environ, "REISSUE_BIN": str(bin_dir), **(env or {})}, timeout=600)
    return result, log.read_text().splitlines() if log.exists() else []


def test_names_outside_studies_are_refused_and_the_run_folder_is_the_studys_name(tmp_path):
    result, asked = reissue(tmp_path, "../evil", "/tmp/evil", "linked", "file-name")
    assert result.returncode == 1, result.stderr
    assert "reissue: '../evil' is not the name of a study file in studies/" in result.stderr
    assert "reissue: '/tmp/evil' is not the name of a study file in studies/" in result.stderr
    assert f"reissue: studies/linked.yaml is a link out of studies/ (to {tmp_path / 'evil.yaml'})" in result.stderr
    # only the study of studies/, into runs/<its name:>, where its report is read from
    assert asked == ["run studies/file-name.yaml --out runs/yaml-name --jobs 1 --quiet --reports reports",
                     "report runs/yaml-name --out reports --with-data", "report-index"]
    assert result.stderr.rstrip().endswith("reissue: not complete: ../evil /tmp/evil linked")


def test_another_runs_folder_is_used_and_its_other_studies_are_offered_for_reuse(tmp_path):
    """REISSUE_RUNS (the 2026 table's runs, kept outside the checkout across sessions): the study's
    folder is there, and every other study's folder there with a store is passed to --reuse."""
    runs = tmp_path / "table-runs"
    (runs / "other-study").mkdir(parents=True)
    (runs / "other-study" / "results.db").write_bytes(b"")
    (runs / "no-store").mkdir()
    result, asked = reissue(tmp_path, "file-name", env={"REISSUE_RUNS": str(runs)})
    assert result.returncode == 0, result.stderr
    assert asked[:2] == [f"run studies/file-name.yaml --out {runs}/yaml-name --jobs 1 --quiet --reports reports "
                         f"--reuse {runs}/other-study", f"report {runs}/yaml-name --out reports --with-data"]
