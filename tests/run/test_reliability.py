"""Reliability and security (issue 17): nothing in a run folder executes code, one writer per
output folder, exact resume, signals, bounded validation, damaged folders. Each case asserts
the one-line message and that nothing finished was lost."""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import HANG_GUARD_S, LEAVE_S, cpu_so_far, wait_within_cpu

from workbench import stopping
from workbench.errors import WorkbenchError
from workbench.api import run_study
from workbench.run.store import DB_FILE, Store, load_results, run_dir
from workbench.study import load_study
from workbench.recipes.train.sweep import expand
from workbench.results import FINAL_WEIGHTS, LAST_CHECKPOINT, RESULT_FILE, Status
from workbench.run import batches
from workbench.run.batches import StepBatches
from workbench.run.run_module import RunModule
from workbench.run.train import train_run
from workbench.model.weights import load_final_model

STUDY = """\
name: tiny-reliability
task: {name: copy, train_length: 6, eval_lengths: [6], n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope, dropout: 0.1}
train: {steps: 20, batch_size: 8, lr: 3.0e-3, warmup_steps: 2, eval_every: 10, log_every: 5, checkpoint_every: 5}
seeds: [0]
sweep:
  model.position: [none, rope]
"""


@pytest.fixture(autouse=True)
def one_thread_and_no_stop():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    stopping.reset()
    yield
    stopping.reset()
    torch.set_num_threads(before)


def write(tmp_path: Path, text: str = STUDY, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- exact resume, and a stop request in the middle of a run ---------------------------------


@pytest.mark.parametrize(("stop_at", "most_per_call", "stopped_at"), [
    (3, 1, 3), (13, 1, 13),  # one step a call: at the step the request arrives in, below and above half the budget
    (3, 16, 5), (13, 16, 15),  # 5 steps a call (the study's every-5 records): at the end of that call
])
def test_a_run_stopped_at_any_step_resumes_exactly(tmp_path, monkeypatch, stop_at, most_per_call, stopped_at):
    monkeypatch.setattr(batches, "MAX_STEPS_PER_CALL", most_per_call)
    run = expand(load_study(write(tmp_path)))[0]
    reference = train_run(run.run_id, run.config, tmp_path / "uninterrupted")

    original_step = RunModule.take_step

    def stop_during(self, *args):
        if self.global_step == stop_at - 1:  # a signal arrives while step `stop_at` runs
            stopping.request_stop("SIGTERM")
        return original_step(self, *args)

    monkeypatch.setattr(RunModule, "take_step", stop_during)
    with pytest.raises(stopping.RunInterrupted, match=f"stopped at step {stopped_at}"):
        train_run(run.run_id, run.config, tmp_path / "resumed")
    assert not (tmp_path / "resumed" / RESULT_FILE).exists()  # nothing recorded for a stopped run
    monkeypatch.setattr(RunModule, "take_step", original_step)
    stopping.reset()

    seen: list[int] = []
    original_item = StepBatches.__getitem__
    monkeypatch.setattr(StepBatches, "__getitem__", lambda self, i: seen.append(i) or original_item(self, i))
    resumed = train_run(run.run_id, run.config, tmp_path / "resumed")
    assert resumed.status == Status.FINISHED and resumed.resumed_from_step == stopped_at
    assert seen == list(range(stopped_at, 20))  # each batch once, in order
    assert resumed.metrics == reference.metrics  # exact on the CPU (dropout included)
    # Every curve point equal, except the training seconds each step had taken: a clock, not a result.
    timed = [(step, split, metric) for step, split, metric, _ in reference.curves if (split, metric) == ("progress", "seconds")]
    assert timed and timed == [c[:3] for c in resumed.curves if c[1:3] == ("progress", "seconds")]
    assert ([c for c in resumed.curves if c[1:3] != ("progress", "seconds")]
            == [c for c in reference.curves if c[1:3] != ("progress", "seconds")])
    a, _ = load_final_model(tmp_path / "uninterrupted")
    b, _ = load_final_model(tmp_path / "resumed")
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name


OLD_CHECKPOINTS = Path(__file__).parent.parent / "data" / "checkpoints" / "automatic-optimization"


@pytest.mark.parametrize("stopped_at", [10, 13])  # at the end of a call of 5 steps, and inside one
def test_a_checkpoint_of_the_loop_before_calls_of_k_steps_resumes_exactly(tmp_path, stopped_at):
    """Checkpoints written by the code of 2026-12-06 (3ee4e7f: Lightning's automatic optimization,
    one call per step), of this study's first run stopped by a request at step 10 and at step 13:
    resumed by today's loop, the run ends as an uninterrupted one does, to the last bit."""
    run = expand(load_study(write(tmp_path)))[0]
    reference = train_run(run.run_id, run.config, tmp_path / "uninterrupted")
    folder = tmp_path / "resumed"
    (folder / LAST_CHECKPOINT).parent.mkdir(parents=True)
    (folder / LAST_CHECKPOINT).write_bytes((OLD_CHECKPOINTS / f"step{stopped_at}.ckpt").read_bytes())
    resumed = train_run(run.run_id, run.config, folder)
    assert resumed.status == Status.FINISHED and resumed.resumed_from_step == stopped_at
    assert resumed.environment["steps_per_call"] == math.gcd(5, stopped_at)
    assert resumed.metrics == reference.metrics
    assert ([c for c in resumed.curves if c[1:3] != ("progress", "seconds")]
            == [c for c in reference.curves if c[1:3] != ("progress", "seconds")])


# ---- nothing in a run folder executes code ---------------------------------------------------


class Exploit:
    """A pickle that, when loaded with weights_only=False, would create a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_crafted_pickle_in_a_run_folder_is_refused(tmp_path):
    run = expand(load_study(write(tmp_path)))[0]
    folder = tmp_path / "run"
    marker = tmp_path / "pwned"
    (folder / "checkpoints").mkdir(parents=True)
    torch.save({"global_step": 5, "payload": Exploit(marker)}, folder / LAST_CHECKPOINT)

    result = train_run(run.run_id, run.config, folder)  # resuming would load last.ckpt
    assert result.status == "failed"
    assert str(folder / LAST_CHECKPOINT) in result.error and "refused" in result.error
    assert "delete it to train this run from the start" in result.error
    assert not marker.exists()

    # final weights of an old run folder (final.pt) are loaded with weights_only=True too
    torch.save({"config": run.config, "state_dict": Exploit(marker)}, folder / "final.pt")
    with pytest.raises(WorkbenchError, match=r"final\.pt holds Python objects .*refused"):
        load_final_model(folder)
    assert not marker.exists()


# ---- one writer per folder -------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_out(tmp_path_factory):
    """The two-run study, finished, in one folder (shared by the damaged-folder tests: copy it)."""
    tmp = tmp_path_factory.mktemp("finished")
    torch.set_num_threads(1)
    summary = run_study(write(tmp, STUDY.replace("steps: 20", "steps: 10")), tmp / "out", quiet=True)
    assert summary.statuses == {"finished": 2}
    return tmp / "study.yaml", tmp / "out"


def copy_of(finished_out, tmp_path) -> tuple[Path, Path]:
    import shutil

    study, out = finished_out
    shutil.copytree(out, tmp_path / "out")
    return study, tmp_path / "out"


def finished_ids(out: Path) -> set[str]:
    return set(load_results(out).query("status == 'finished'").run_id)


def test_a_second_writer_is_refused_naming_the_holder_and_readers_still_work(finished_out, tmp_path):
    from workbench.run.folder import WriterLock

    study, out = copy_of(finished_out, tmp_path)
    before = finished_ids(out)
    with WriterLock(out):  # another `workbench run` holds the folder
        for fresh in (False, True):
            with pytest.raises(WorkbenchError, match=rf"being written by another `workbench run` \(pid {os.getpid()}\)"):
                run_study(study, out, quiet=True, fresh=fresh)
        assert finished_ids(out) == before  # --fresh deleted nothing
        assert len(load_results(out)) == 2  # readers work alongside the writer
    assert run_study(study, out, quiet=True).skipped == 2  # released: the folder is usable again


def test_two_processes_create_one_store_at_once(tmp_path):
    code = "import sys; from workbench.run.store import Store; Store(sys.argv[1]); print('ok')"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "out")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for _ in range(3)]
    outputs = [wait_within_cpu(p, 120).stdout.decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs


# ---- signals ---------------------------------------------------------------------------------

LONG = STUDY.replace("steps: 20", "steps: 5000").replace("eval_every: 10", "eval_every: 2500")


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def descendants(pid: int) -> list[int]:
    """Every process under `pid`: a forkserver's workers are the driver's grandchildren."""
    out = children(pid)
    for child in list(out):
        out += descendants(child)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def still_alive_after(pids: list[int], seconds: float) -> list[int]:
    """The processes of `pids` still running after waiting up to `seconds` for them to end
    (multiprocessing's resource tracker, for one, leaves a moment after its parent)."""
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [pid for pid in pids if alive(pid)]


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group has ended
        pass


def start_sweep(tmp_path: Path, jobs: int) -> tuple[subprocess.Popen, Path, list]:
    study, out = write(tmp_path, LONG), tmp_path / "out"
    runs = expand(load_study(study))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(study), "--out", str(out), "--quiet",
                             "--jobs", str(jobs), "--reports", str(tmp_path / "reports")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + HANG_GUARD_S
    training = runs[:jobs]
    while not all((out / "runs" / r.run_id / LAST_CHECKPOINT).exists() for r in training):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_group(proc)
            pytest.fail(f"the sweep did not start training: {proc.communicate()}")
        time.sleep(0.05)
    return proc, out, training


@pytest.mark.parametrize("jobs", [1, 2])
def test_sigterm_checkpoints_records_nothing_half_and_exits_non_zero(tmp_path, jobs):
    proc, out, training = start_sweep(tmp_path, jobs)
    workers = descendants(proc.pid) if jobs > 1 else []
    try:
        proc.send_signal(signal.SIGTERM)  # to the driver only
        err = wait_within_cpu(proc, 300).stderr
    finally:
        kill_group(proc)
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert proc.returncode == 130
    assert lines[-1].startswith("error: stopped by SIGTERM: 0 of 2 runs done and recorded")
    assert "run the same command again to continue" in lines[-1] and "Traceback" not in err.decode()
    assert not still_alive_after(workers, LEAVE_S)
    assert Store(out, create=False).statuses() == {}  # no run recorded as failed
    for run in training:  # each stopped run kept a checkpoint of its last step, and no result
        folder = run_dir(out, run.run_id)
        assert torch.load(folder / LAST_CHECKPOINT, weights_only=True)["global_step"] > 0
        assert not (folder / RESULT_FILE).exists()


def test_no_worker_outlives_a_sigkilled_driver(tmp_path):
    proc, out, training = start_sweep(tmp_path, 2)
    workers = [pid for pid in descendants(proc.pid) if alive(pid)]
    assert workers
    proc.kill()
    proc.wait()
    left = still_alive_after(workers, LEAVE_S)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "orphaned workers"


# ---- damaged folders -------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_store_is_named_recovered_from_run_folders_and_fresh_starts_over(finished_out, tmp_path, damage):
    study, out = copy_of(finished_out, tmp_path)
    before = finished_ids(out)
    db = out / DB_FILE
    if damage == "garbage":
        db.write_bytes(b"not a database at all" * 100)
    else:
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 3])
    for wal in out.glob(f"{DB_FILE}-*"):
        wal.unlink()
    for call in (lambda: load_results(out), lambda: run_study(study, out, quiet=True)):
        with pytest.raises(WorkbenchError, match=r"results\.db is not a readable workbench store .*move it away"):
            call()
    # as the message says: moved away, the finished runs come back from their result.json
    db.rename(out / "results.db.damaged")
    summary = run_study(study, out, quiet=True)
    assert summary.statuses == {"finished": 2} and finished_ids(out) == before
    assert {r["attempts"] for r in Store(out).runs()} == {1}

    # --fresh starts over even from a damaged store
    db.write_bytes(b"\0garbage" * 64)
    summary = run_study(study, out, quiet=True, fresh=True)
    assert summary.statuses == {"finished": 2} and finished_ids(out) == before


def test_an_invalid_result_json_is_named_and_its_run_trained_again(finished_out, tmp_path, capsys):
    study, out = copy_of(finished_out, tmp_path)
    first, second = expand(load_study(study))
    with sqlite3.connect(out / DB_FILE) as conn:  # the driver died before recording the second run
        conn.execute("DELETE FROM runs WHERE run_id = ?", (second.run_id,))
    (run_dir(out, second.run_id) / RESULT_FILE).write_text('{"run_id": "x", "status": "fini')
    summary = run_study(study, out, quiet=True)
    assert f"{run_dir(out, second.run_id) / RESULT_FILE} is not a readable result" in capsys.readouterr().err
    assert summary.skipped == 1 and summary.statuses == {"finished": 1}
    assert finished_ids(out) == {first.run_id, second.run_id}


def test_a_read_only_results_folder_is_read(finished_out, tmp_path, monkeypatch):
    """A folder this process may not write (a received copy, a read-only mount). The tests run as
    root, who may write anywhere, so the permission is what os.access reports."""
    import workbench.run.store as store_module

    study, out = copy_of(finished_out, tmp_path)
    assert not list(out.glob(f"{DB_FILE}-*"))
    real_access = os.access
    monkeypatch.setattr(store_module.os, "access",
                        lambda path, mode: False if mode == os.W_OK and Path(path) == out else real_access(path, mode))
    monkeypatch.setattr(store_module.os, "open", lambda path, *a, **k: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied", str(path))))
    assert len(load_results(out)) == 2 and len(store_module.load_curves(out)) > 0
    assert not list(out.glob(f"{DB_FILE}-*"))  # read as immutable: no WAL side files written
    with pytest.raises(WorkbenchError, match=r"cannot write here \(Permission denied\); use --out"):
        run_study(study, out, quiet=True)
    assert finished_ids(out) == set(load_results(out).run_id)


def test_a_truncated_checkpoint_names_the_file_and_what_to_do(tmp_path):
    run = expand(load_study(write(tmp_path)))[0]
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / LAST_CHECKPOINT).write_bytes(b"PK\x03\x04 truncated")
    result = train_run(run.run_id, run.config, folder)
    assert result.status == "failed"
    assert f"{folder / LAST_CHECKPOINT} is damaged or not a checkpoint" in result.error
    assert result.error.endswith("delete it to train this run from the start")


def test_a_truncated_final_weights_file_keeps_the_old_report(finished_out, tmp_path):
    from workbench.api import write_report
    study, out = copy_of(finished_out, tmp_path)
    index = write_report(out, tmp_path / "reports")
    old = index.read_text()
    weights = run_dir(out, expand(load_study(study))[0].run_id) / FINAL_WEIGHTS
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(WorkbenchError, match=rf"{FINAL_WEIGHTS} is damaged .*--no-pictures"):
        write_report(out, tmp_path / "reports")
    assert index.read_text() == old and (index.parent / "results.csv").exists()
    assert [p.name for p in (tmp_path / "reports").iterdir()] == [index.parent.name]  # no leftovers


def test_a_binary_study_file_is_one_message(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(WorkbenchError, match=r"study\.yaml: not a text \(UTF-8\) file"):
        load_study(path)


def test_a_full_disk_is_one_message_and_keeps_what_was_recorded(finished_out, tmp_path, monkeypatch):
    import sqlite3 as sqlite

    study, out = copy_of(finished_out, tmp_path)
    first, second = expand(load_study(study))
    with sqlite3.connect(out / DB_FILE) as conn:
        conn.execute("DELETE FROM runs WHERE run_id = ?", (second.run_id,))
    real_connect = sqlite.connect

    class FullDisk:
        def __init__(self, conn):
            self.conn = conn

        def execute(self, sql, *args):
            if sql.lstrip().startswith("INSERT OR REPLACE INTO runs"):
                raise sqlite.OperationalError("database or disk is full")
            return self.conn.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.conn, name)

    monkeypatch.setattr(sqlite, "connect", lambda *a, **k: FullDisk(real_connect(*a, **k)))
    with pytest.raises(WorkbenchError, match=r"results\.db: the disk is full .*free some space and run again"):
        run_study(study, out, quiet=True)
    monkeypatch.undo()
    assert finished_ids(out) == {first.run_id}  # the recorded run is intact
    assert run_study(study, out, quiet=True).statuses == {"finished": 1}  # and the next run records the other


# ---- bounded validation ----------------------------------------------------------------------

BOMB = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
               for p, c in zip(["", *"abcdefgh"], "abcdefghi"))


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    path = write(tmp_path, BOMB)
    assert len(BOMB.encode()) < 420
    with pytest.raises(WorkbenchError, match=r"aliases \(\*name\) expand to 4\.9e\+08 nodes, over the limit of 100000"):
        load_study(path)
    # a study that uses a few aliases is fine
    text = STUDY.replace("seeds: [0]", "seeds: &s [0]\nprofiles: {same: {seeds: *s}}")
    assert load_study(write(tmp_path, text, "ok.yaml")).study.name == "tiny-reliability"


def test_the_sweep_size_is_capped_with_a_message(tmp_path, monkeypatch):
    values = ", ".join(str(1e-4 * (i + 1)) for i in range(1000))
    text = STUDY.replace("model.position: [none, rope]", f"model.position: [none, rope]\n  train.lr: [{values}]")
    text = text.replace("seeds: [0]", f"seeds: [{', '.join(map(str, range(10)))}]")
    with pytest.raises(WorkbenchError, match=r"sweep: 2000 sweep points x 10 seeds = 20000 runs, over the limit of "
                                             r"10000; .*WORKBENCH_MAX_RUNS"):
        expand(load_study(write(tmp_path, text)))
    monkeypatch.setenv("WORKBENCH_MAX_RUNS", "100")
    with pytest.raises(WorkbenchError, match="over the limit of 100;"):
        expand(load_study(write(tmp_path, STUDY.replace("seeds: [0]", f"seeds: [{', '.join(map(str, range(51)))}]"))))


def test_absurd_sizes_are_refused_at_validate_with_the_number(tmp_path):
    from workbench.model.transformer import build_model
    from workbench.recipes.train.sweep import estimated_parameters

    big = STUDY.replace("d_model: 32, n_layers: 1", "d_model: 100000, n_layers: 100")
    with pytest.raises(WorkbenchError, match=r"model\.d_model: about 1\.2e\+13 parameters .*over the limit of 2e\+10"):
        expand(load_study(write(tmp_path, big)))
    wide = STUDY.replace("batch_size: 8", "batch_size: 1.0e+11")
    with pytest.raises(WorkbenchError, match=r"train\.batch_size: 100000000000 sequences of length 6 need about "
                                             r"[0-9.e+]+ GiB of activations"):
        expand(load_study(write(tmp_path, wide)))
    # the estimate is an instrument: close to the real count of a built model
    for text in (STUDY, STUDY.replace("family: decoder", "family: encoder_decoder")):
        for run in expand(load_study(write(tmp_path, text))):
            real = build_model(run.config["model"]).num_parameters()
            assert 0.8 * real <= estimated_parameters(run.config["model"]) <= 1.25 * real


@pytest.mark.parametrize("line, message", [
    ("seeds: [4294967296]", r"seeds\.0: Input should be less than or equal to 4294967295"),
    ("seeds: [-1]", r"seeds\.0: Input should be greater than or equal to 0"),
    ("lr: .inf", r"train\.lr: Input should be a finite number"),
    ("accelerator: tpux", r"train\.accelerator: Input should be 'auto', 'cpu'"),
    ("devices: -3", r"train\.devices: expected a device count >= 1, -1 \(all\)"),
    ("strategy: dddp", r"train\.strategy: unknown Lightning strategy 'dddp'"),
])
def test_impossible_training_settings_are_refused(tmp_path, line, message):
    if line.startswith("seeds"):
        text = STUDY.replace("seeds: [0]", line)
    elif line.startswith("lr"):
        text = STUDY.replace("lr: 3.0e-3", line)
    else:
        text = STUDY.replace("checkpoint_every: 5}", f"checkpoint_every: 5, {line}}}")
    with pytest.raises(WorkbenchError, match=message):
        load_study(write(tmp_path, text))


def test_the_strategy_names_are_lightnings():
    from pytorch_lightning.strategies import StrategyRegistry

    from workbench.study.train_section import LIGHTNING_STRATEGIES

    firsts = {name.split("_")[0] for name in StrategyRegistry.available_strategies()}
    assert set(LIGHTNING_STRATEGIES) - {"auto"} <= firsts


def test_a_full_disk_while_a_run_ends_is_one_message(tmp_path, monkeypatch):
    import workbench.run.train as train_module

    run = expand(load_study(write(tmp_path)))[0]

    def full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train_module, "write_json_atomic", full)
    with pytest.raises(WorkbenchError, match=r"result\.json: cannot write it \(No space left on device\); free some space"):
        train_run(run.run_id, run.config, tmp_path / "run")


# ---- one stop protocol: a group signal (a terminal's Ctrl-C) with --jobs 2, at any moment -----

SHORT = STUDY.replace("seeds: [0]", "seeds: [0, 1]")  # 4 runs of 20 steps


def group_signal(tmp_path: Path, text: str, when, sig: int = signal.SIGINT) -> tuple[subprocess.Popen, str, Path, list[int]]:
    """Start `workbench run --jobs 2` in a process group of its own, wait until `when(out, proc)`
    is true, send `sig` to the whole group (SIGINT: what a terminal's Ctrl-C does; SIGTERM: what
    a scheduler or `kill -- -PGID` does); returns the process, its stderr, the output folder
    and every process the group had when signalled."""
    study, out = write(tmp_path, text), tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(study), "--out", str(out), "--quiet",
                             "--jobs", "2", "--reports", str(tmp_path / "reports")],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + HANG_GUARD_S
    while not when(out, proc):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_group(proc)
            pytest.fail(f"the moment to signal never came: {proc.communicate()}")
        time.sleep(0.02)
    group = [proc.pid, *descendants(proc.pid)]
    os.killpg(proc.pid, sig)
    try:
        err = wait_within_cpu(proc, 300).stderr
    finally:
        kill_group(proc)
    return proc, err.decode(), out, group


def assert_one_true_line_and_nothing_left(proc, err: str, group: list[int], sig: str = "SIGINT") -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130, err
    assert len(lines) == 1 and lines[0].startswith(f"error: stopped by {sig}"), err
    assert not still_alive_after(group, LEAVE_S), f"a process outlived the stop by {LEAVE_S:g} s"
    return lines[0]


def test_a_group_signal_during_start_up_stops_before_anything_is_written(tmp_path):
    # 1.5 s of the driver's CPU, not of wall time: on a loaded machine that moment of its start-up
    # could come before the driver had imported anything, let alone set its handlers
    proc, err, out, group = group_signal(tmp_path, SHORT, lambda out, proc: cpu_so_far(proc.pid) > 1.5)
    line = assert_one_true_line_and_nothing_left(proc, err, group)
    if "before the sweep began" in line:
        assert "nothing was trained or recorded" in line and not (out / DB_FILE).exists()
    else:  # a slow start: the signal came once the workers were starting
        assert "0 of 4 runs done" in line and Store(out, create=False).statuses() == {}
    assert run_study(write(tmp_path, SHORT), out, quiet=True).statuses == {"finished": 4}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_group_signal_mid_training_checkpoints_both_runs_and_records_none_failed(tmp_path, sig):
    """SIGTERM too (issue 40): Lightning's SIGTERM handler in the workers would end their runs
    with a bare `stopped` and no checkpoint of the step they stopped at."""
    long = LONG.replace("seeds: [0]", "seeds: [0, 1]")
    runs = expand(load_study(write(tmp_path, long)))
    training = lambda out, proc: all((out / "runs" / r.run_id / LAST_CHECKPOINT).exists() for r in runs[:2])
    proc, err, out, group = group_signal(tmp_path, long, training, sig)
    line = assert_one_true_line_and_nothing_left(proc, err, group, signal.Signals(sig).name)
    assert "0 of 4 runs done and recorded" in line and line.count("checkpointed it") == 2
    assert Store(out, create=False).statuses() == {}  # nothing recorded, so nothing failed
    steps = [int(s) for s in re.findall(r"stopped at step (\d+)", line)]
    for run in runs[:2]:  # the checkpoint holds the step the line names
        step = torch.load(run_dir(out, run.run_id) / LAST_CHECKPOINT, weights_only=True)["global_step"]
        assert step in steps


def test_a_group_signal_during_the_report_keeps_every_run_and_the_next_report_cleans_up(tmp_path):
    from workbench.api import write_report

    building = lambda out, proc: any((tmp_path / "reports").glob(".*.building-*"))
    proc, err, out, group = group_signal(tmp_path, SHORT, building)
    line = assert_one_true_line_and_nothing_left(proc, err, group)
    assert "after the sweep: its 4 runs are recorded" in line and "the report was not written" in line
    assert Store(out, create=False).statuses() == dict.fromkeys(Store(out, create=False).statuses(), "finished")
    assert len(Store(out, create=False).statuses()) == 4
    write_report(out, tmp_path / "reports", pictures=False)  # the next report removes the killed one's folder
    assert [p.name for p in (tmp_path / "reports").iterdir()] == ["tiny-reliability"]


@pytest.mark.parametrize("gpu", [True, False], ids=["spawned", "forked from the forkserver"])
def test_a_worker_ignores_sigint_and_sigterm_from_its_first_instruction(gpu):
    """Issue 40: a spawned worker's blocked mask was reset (SigBlk 0: starting multiprocessing's
    resource tracker unblocks both in the driver), so a group signal while it imported torch
    killed it and its run was recorded failed. Read from /proc as soon as start() returns,
    before the child has run a line of Python; with no resource tracker and no forkserver yet,
    as in a driver that starts its first worker. A forked worker's mask is its forkserver's."""
    from workbench.run.executor import Worker, reap_resource_tracker, stop_forkserver, worker_context

    stop_forkserver()
    reap_resource_tracker()

    handlers = {sig: signal.getsignal(sig) for sig in stopping.SIGNALS}
    worker = Worker(worker_context(gpu), threads=1)
    try:
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{worker.process.pid}/status").read_text().splitlines()
                      if line.startswith(("SigIgn", "SigBlk")))
        held = int(status["SigIgn"], 16) | int(status["SigBlk"], 16)
        assert all(held >> (sig - 1) & 1 for sig in stopping.SIGNALS), status
        if not gpu:  # forked from a forkserver that has loaded torch: a worker pays no import of its own
            assert "libtorch_cpu" in Path(f"/proc/{worker.process.pid}/maps").read_text()
        os.kill(worker.process.pid, signal.SIGINT)
        os.kill(worker.process.pid, signal.SIGTERM)
        worker.leave()
        worker.process.join(HANG_GUARD_S)
        assert worker.process.exitcode == 0  # it left when told to, not killed by either signal
    finally:
        worker.end()
        stop_forkserver()
    assert {sig: signal.getsignal(sig) for sig in stopping.SIGNALS} == handlers  # the driver's are back


def test_a_signal_to_the_driver_while_a_worker_starts_reaches_its_handler():
    received = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        with stopping.signals_blocked():
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # Python runs the handler at its next instruction
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_group_signal_as_the_workers_appear_leaves_every_run_pending_without_a_traceback(tmp_path):
    """Issue 40: the moment that killed a worker mid-import (3 of 33 trials)."""
    proc, err, out, group = group_signal(tmp_path, SHORT, lambda out, proc: bool(worker_pids(proc.pid)))
    line = assert_one_true_line_and_nothing_left(proc, err, group)
    assert "0 of 4 runs done" in line and "Traceback" not in err and "KeyboardInterrupt" not in err
    assert not (out / DB_FILE).exists() or Store(out, create=False).statuses() == {}  # nothing failed: all pending


# ---- a dead worker costs only its run -----------------------------------------------------------


def worker_pids(pid: int) -> list[int]:
    """The sweep's worker processes, spawned or forked from its forkserver (not multiprocessing's
    resource tracker, nor the forkserver)."""
    out = []
    for child in children(pid):
        with contextlib.suppress(OSError):  # it ended meanwhile
            command = Path(f"/proc/{child}/cmdline").read_bytes()
            out += [child] if b"spawn_main" in command else children(child) if b"forkserver" in command else []
    return out


def test_a_sigkilled_worker_fails_only_its_run_with_the_reason_and_the_sweep_goes_on(tmp_path):
    text = STUDY.replace("steps: 20", "steps: 400").replace("eval_every: 10", "eval_every: 400").replace(
        "[none, rope]", "[none, rope, sinusoidal]")
    study, out = write(tmp_path, text), tmp_path / "out"
    runs = expand(load_study(study))
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(study), "--out", str(out), "--quiet",
                             "--jobs", "2", "--reports", str(tmp_path / "reports")],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        first = run_dir(out, runs[0].run_id) / LAST_CHECKPOINT
        while not first.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        victim = worker_pids(proc.pid)[0]  # one of the two training workers
        os.kill(victim, signal.SIGKILL)
        done = wait_within_cpu(proc, 300)
        out_text, err = done.stdout, done.stderr
    finally:
        kill_group(proc)
    statuses = Store(out, create=False).statuses()
    failed = [run_id for run_id, status in statuses.items() if status == "failed"]
    assert len(statuses) == 3 and len(failed) == 1, (statuses, err)
    error = load_results(out).set_index("run_id").loc[failed[0], "error"]
    assert "its worker process was killed by signal 9 (SIGKILL)" in error
    assert f"3 runs in {out}: 1 failed, 2 finished; 0 already done" in out_text.decode()  # true counts
    assert "Traceback" not in err.decode()


# ---- no tracebacks: damaged files, a full disk, read-only folders, absurd input -----------------


def test_a_result_json_of_the_wrong_shape_is_named_and_its_run_trained_again(finished_out, tmp_path, capsys):
    study, out = copy_of(finished_out, tmp_path)
    first, second = expand(load_study(study))
    with sqlite3.connect(out / DB_FILE) as conn:
        conn.execute("DELETE FROM runs WHERE run_id = ?", (second.run_id,))
    path = run_dir(out, second.run_id) / RESULT_FILE
    path.write_text(path.read_text().replace('"metrics": {', '"metrics": 5, "was": {'))
    summary = run_study(study, out, quiet=True)
    assert f"{path} is not a readable result (metrics: Input should be a valid dictionary)" in capsys.readouterr().err
    assert summary.statuses == {"finished": 1} and finished_ids(out) == {first.run_id, second.run_id}


@pytest.mark.parametrize("damage, message", [
    ("UPDATE runs SET metrics = '{not json'", r"the row of run '[0-9a-f]{12}' is damaged; move the store away"),
    ("UPDATE runs SET metrics = '[1, 2]'", r"the row of run '[0-9a-f]{12}' is damaged \(metrics: Input should be a valid "
                                           r"dictionary\)"),
    ("DROP TABLE runs", r"results\.db is not a readable workbench store \(no such table: runs\)"),
])
def test_a_damaged_store_row_or_table_is_one_line_from_every_command(finished_out, tmp_path, damage, message):
    from click.testing import CliRunner

    from workbench.cli import main

    study, out = copy_of(finished_out, tmp_path)
    with sqlite3.connect(out / DB_FILE) as conn:
        conn.execute(damage)
    for args in (["results", str(out)], ["report", str(out), "--no-pictures"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and re.search(message, result.output) and len(result.output.splitlines()) == 1, \
            (args, result.output)
    result = CliRunner().invoke(main, ["run", str(study), "--out", str(out), "--quiet"])
    if damage.startswith("DROP"):  # the table is made again and filled from the runs' result.json
        assert result.exit_code == 0 and finished_ids(out) == {run.run_id for run in expand(load_study(study))}
    else:  # the sweep skips its recorded runs; the report reads the damaged row
        assert result.exit_code == 2 and re.search(message, result.output.splitlines()[-1]), result.output


def test_a_weights_file_whose_config_asks_for_a_huge_model_or_lacks_task_is_refused(finished_out, tmp_path):
    import json

    import safetensors.torch

    study, out = copy_of(finished_out, tmp_path)
    folder = run_dir(out, expand(load_study(study))[0].run_id)
    _, config = load_final_model(folder)
    tensors = safetensors.torch.load_file(str(folder / FINAL_WEIGHTS))
    for crafted, problem in (({**config, "model": {**config["model"], "d_model": 100000, "n_layers": 100}},
                              r"asks for a model of 8e\+12 parameters, the file holds 1\.\d+e\+04"),
                             ({k: v for k, v in config.items() if k != "task"}, r"its stored config: task: Field required")):
        safetensors.torch.save_file(tensors, str(folder / FINAL_WEIGHTS), metadata={"config": json.dumps(crafted)})
        with pytest.raises(WorkbenchError, match=rf"{FINAL_WEIGHTS} is damaged .*{problem}.*--no-pictures"):
            load_final_model(folder)


def test_a_read_only_report_destination_is_one_line_and_keeps_the_old_report(finished_out, tmp_path, monkeypatch):
    from workbench.api import write_report
    import workbench.report as report_module

    _, out = copy_of(finished_out, tmp_path)
    index = write_report(out, tmp_path / "reports", pictures=False)
    old = index.read_text()

    def read_only(built, dest):
        raise PermissionError(13, "Permission denied", str(dest / "index.html"))

    monkeypatch.setattr(report_module, "swap_in", read_only)
    with pytest.raises(WorkbenchError, match=r"index\.html: cannot write the report \(Permission denied\); .*--out"):
        write_report(out, tmp_path / "reports", pictures=False)
    assert index.read_text() == old and [p.name for p in (tmp_path / "reports").iterdir()] == [index.parent.name]


def test_a_full_disk_during_a_checkpoint_and_then_error_txt_is_the_runs_outcome(tmp_path, monkeypatch):
    import workbench.run.train as train_module

    run = expand(load_study(write(tmp_path)))[0]
    real_write = train_module.write_text_atomic

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train_module.TorchCheckpointIO, "save_checkpoint", full)
    monkeypatch.setattr(train_module, "write_text_atomic",
                        lambda path, text: full() if path.name == "error.txt" else real_write(path, text))
    result = train_run(run.run_id, run.config, tmp_path / "run")
    assert result.status == Status.FAILED and result.error == "OSError: [Errno 28] No space left on device"
    assert not (tmp_path / "run" / "error.txt").exists() and (tmp_path / "run" / RESULT_FILE).exists()
    # a disk already full when the run starts: one line naming the folder
    monkeypatch.setattr(train_module, "write_text_atomic", full)
    with pytest.raises(WorkbenchError, match=r"run: cannot write the run folder \(No space left on device\); free some"):
        train_run(run.run_id, run.config, tmp_path / "run")


@pytest.mark.parametrize("text, message", [
    ("name: x\nseeds: " + "[" * 5000 + "]" * 5000, r"nested too deeply"),
    ("name: x\nseeds: [" + "9" * 5001 + "]", r"a number with more than 4300 digits"),
    (STUDY.replace("[none, rope]", "[none, rope]\n  train.lr: [" + ", ".join(str(i) for i in range(100_001)) + "]"),
     r"it holds 10\d{4} YAML values, over the limit of 100000: sweep fewer values"),
])
def test_absurd_study_files_are_one_line(tmp_path, text, message):
    with pytest.raises(WorkbenchError, match=message):
        load_study(write(tmp_path, text))


def test_a_device_or_endless_file_is_not_read_as_a_study():
    with pytest.raises(WorkbenchError, match=r"/dev/zero: not a regular file"):
        load_study("/dev/zero")


def test_a_report_name_that_is_a_path_is_refused(finished_out, tmp_path):
    from workbench.recipes.train.compare import write_comparison

    _, out = copy_of(finished_out, tmp_path)
    with pytest.raises(WorkbenchError, match=r"--name: '\.\./x' is not a report name"):
        write_comparison([out], tmp_path / "reports", "../x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("error", [MemoryError("cannot allocate 17179869184 bytes"), "the allocator's own"])
def test_a_memory_error_on_the_cpu_is_recorded_oom(tmp_path, monkeypatch, error):
    run = expand(load_study(write(tmp_path)))[0]

    def exhausted(self, batch, batch_idx):
        if isinstance(error, Exception):
            raise error
        torch.empty(2**60, dtype=torch.uint8)  # what PyTorch's CPU allocator raises: a RuntimeError

    monkeypatch.setattr(RunModule, "training_step", exhausted)
    result = train_run(run.run_id, run.config, tmp_path / "run")
    assert result.status == Status.OOM and ("MemoryError" in result.error or "can't allocate memory" in result.error)


def test_a_worker_killed_by_the_oom_killer_is_recorded_oom(monkeypatch):
    from workbench.run import executor

    job = executor.Job("0123456789ab", {}, Path("x"))
    monkeypatch.setattr(executor, "oom_kills", lambda: 4)
    assert [r.status for r in executor.death_result(job, -9, 3)] == [Status.OOM]  # the kernel's count went up
    [killed] = executor.death_result(job, -9, 4)
    assert killed.status == Status.FAILED and "killed by signal 9 (SIGKILL)" in killed.error
    together = executor.Job("0123456789ab", {}, Path("x"), together=(executor.Job("ba9876543210", {}, Path("y")),))
    assert [(r.run_id, r.status) for r in executor.death_result(together, -9, 4)] == [
        ("0123456789ab", Status.FAILED), ("ba9876543210", Status.FAILED)]  # every run trained in that worker


# ---- issue 40: bounded reading of what a run folder holds --------------------------------------


@pytest.mark.parametrize("text, problem", [
    ("[" * 200_000 + "]" * 200_000, "result.json: nested over 32 levels deep"),
    ('{"run_id": "x", "status": "finished", "steps_done": true}', "steps_done: Input should be a valid integer"),
    ('{"run_id": "x", "status": "finished", "metrics": {"loss@6": NaN}}', "result.json: NaN is not a finite number"),
])
def test_a_result_json_too_deep_or_out_of_shape_is_named_and_its_run_trained_again(finished_out, tmp_path, text,
                                                                                   problem):
    from workbench.run.runner import recorded_result

    study, out = copy_of(finished_out, tmp_path)
    run = expand(load_study(study))[0]
    path = run_dir(out, run.run_id) / RESULT_FILE
    path.write_text(text)
    warnings: list[str] = []
    assert recorded_result(run, out, warn=warnings.append) is None
    assert len(warnings) == 1 and problem in warnings[0] and "training that run again" in warnings[0], warnings


def test_a_result_json_over_its_size_limit_is_refused_before_it_is_parsed(finished_out, tmp_path, monkeypatch):
    import workbench.run.runner as runner

    study, out = copy_of(finished_out, tmp_path)
    run = expand(load_study(study))[0]
    path = run_dir(out, run.run_id) / RESULT_FILE
    monkeypatch.setattr(runner, "MAX_RESULT_BYTES", path.stat().st_size - 1)
    monkeypatch.setattr(runner, "load_json", lambda *a, **k: pytest.fail("parsed a file over the limit"))
    warnings: list[str] = []
    assert runner.recorded_result(run, out, warn=warnings.append) is None
    assert "MiB, more than the workbench writes there" in warnings[0]


@pytest.mark.parametrize("text", ["[1]", '{"step": "x", "loss": 1}', '{"step": 3}', "{", '{"step": 3, "loss": NaN}'])
def test_a_malformed_progress_file_leaves_the_live_display_running(tmp_path, text):
    """A progress.json the run did not write (or half a write) killed the display's thread."""
    import io

    from rich.console import Console

    from workbench.run.executor import Job
    from workbench.run.runner import SweepProgress

    progress = SweepProgress("t", 1, quiet=False, console=Console(file=io.StringIO()), poll_s=3600)
    try:
        job = Job("0" * 12, {"train": {"steps": 10}}, tmp_path)
        progress.started(job, "a run")
        (tmp_path / "progress.json").write_text(text)
        progress.refresh_runs()  # raised in the poller thread before
        (tmp_path / "progress.json").write_text('{"step": 4, "loss": 0.5, "steps": 10, "seconds": 1}')
        progress.refresh_runs()
        assert progress.progress.tasks[-1].completed == 4
    finally:
        progress.close()


def test_a_stop_counts_the_seed_rounds_added_since_the_sweep_began(tmp_path):
    """Adaptive seeds grow the sweep: the stop line counts against what it grew to, never '13 of 6'."""
    from workbench.kinds import RunOptions
    from workbench.run.runner import sweeping

    with pytest.raises(stopping.RunInterrupted) as stopped:
        with sweeping("grown", tmp_path, 6, RunOptions(quiet=True)) as (summary, _):
            summary.skipped, summary.total = 13, 18  # 6 planned, then two rounds of seeds, 13 of them done
            raise stopping.RunInterrupted("stopped at step 795")
    assert "13 of 18 runs done and recorded" in str(stopped.value)
