"""The `workbench` command. User mistakes print one message and exit 2, never a traceback.

Each command imports what it uses inside its function: `workbench --help`, `list` and `new-plugin`
then start without loading the runner, Lightning or the report layer (matplotlib, seaborn).
"""

from __future__ import annotations

from workbench import importing, stopping

OWN_PROCESS = __name__ == "__main__"  # not called from other code (tests): may end the process itself
if OWN_PROCESS:  # `python -m workbench.cli`: the stop handler before the heavy imports
    stopping.install_handlers()
    importing.own_process()

import json
import math
import os
import sys
import warnings
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from workbench.errors import SpecError, WorkbenchError, WorkbenchWarning
from workbench.registry import NOUN_OF_AXIS, distribution_of, variants
from workbench.run.folder import default_reports_dir
from workbench.study.keys import hydra_hint
from workbench.variants import AXES


class RunsIncomplete(WorkbenchError):
    """Some runs of a sweep did not finish: their report is written, the exit status says so."""

    exit_code = 3


class WorkbenchGroup(click.Group):
    def parse_args(self, ctx, args):
        ctx.meta["workbench.args"] = list(args)  # the command line as given, for hydra_hint
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as err:
            err.message += hydra_hint(ctx.meta.get("workbench.args", []))
            raise
        except WorkbenchError as err:
            click.echo(f"error: {err}", err=True)
            if isinstance(err, stopping.RunInterrupted) and OWN_PROCESS:
                sys.stdout.flush()  # everything is on disk: skip the interpreter's seconds-long teardown
                os._exit(err.exit_code)
            sys.exit(getattr(err, "exit_code", 2))
        except KeyboardInterrupt:  # Ctrl-C outside a sweep (which stops cleanly by itself)
            click.echo("error: interrupted", err=True)
            sys.exit(130)


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A plugin that failed to load (or a report part skipped) is one line on stderr."""
    if issubclass(category, WorkbenchWarning):
        click.echo(f"warning: {message}", err=True)
    else:
        DEFAULT_SHOWWARNING(message, category, filename, lineno, file, line)


DEFAULT_SHOWWARNING = warnings.showwarning


@click.group(cls=WorkbenchGroup)
@click.version_option(package_name="transformer-workbench")
def main() -> None:
    """Declare studies of Transformer design choices, run them, read the reports."""
    warnings.showwarning = show_warning
    if click.get_current_context().invoked_subcommand not in ("run", "plan"):
        stopping.leave_to_default()  # only a sweep (a study's, a plan's pilot) stops cleanly (workbench.stopping)


def variant_rows(axis: str) -> list[dict]:
    return [
        {
            "axis": axis,
            "name": name,
            "summary": cls.summary(),
            "package": distribution_of(cls),
            "parameters": cls.declared_parameters(),
        }
        for name, cls in variants(axis).items()
    ]


@main.command("list")
@click.argument("axis", required=False, type=click.Choice(AXES))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def list_variants(axis: str | None, as_json: bool) -> None:
    """Every registered variant by axis, with its parameters and the package it comes from."""
    rows = [row for a in ([axis] if axis else AXES) for row in variant_rows(a)]
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    console = Console()
    for a in [axis] if axis else AXES:
        table = Table(title=f"{NOUN_OF_AXIS[a]}s ({a})", title_justify="left")
        # Names are looked up verbatim: never cut one, at any width (a pipe gets 80 columns). A
        # column is at least as wide as its longest name, and a longer word folds onto the next
        # line instead of ending in "…".
        params = [p["name"] + ":" for r in rows if r["axis"] == a for p in r["parameters"]]
        table.add_column("name", no_wrap=True)
        table.add_column("parameters (type = default)", overflow="fold", min_width=max(map(len, params), default=1))
        table.add_column("description", overflow="fold")
        table.add_column("package", no_wrap=True, min_width=max((len(r["package"]) for r in rows), default=7))
        for row in (r for r in rows if r["axis"] == a):
            params = "\n".join(
                f"{p['name']}: {p['type']} = {'required' if p['required'] else p['default']!r}  {p['help']}"
                for p in row["parameters"]
            )
            # Help text and types hold brackets ("list[int]", "[MAX ...]") that rich would read as markup.
            table.add_row(row["name"], escape(params) if params else "-", escape(row["summary"]), row["package"])
        console.print(table)


# ---- studies (issue 4): run, validate, results, schema --------------------------------------


@main.command("run")
@click.argument("study")
@click.option("--out", default=None, help="output folder (default: runs/<study name>/)")
@click.option("--jobs", default=1, show_default=True, type=click.IntRange(min=1),
              help="runs at once, each in its own process; a run trains on at most cores // jobs torch "
                   "threads (one for a small model, where more would wait for each other)")
@click.option("--fresh", is_flag=True, help="discard this study's earlier results in the output folder (another version of it) and start "
                   "over; a folder of another study is refused")
@click.option("--profile", default=None, help="apply the study's named overrides (e.g. gpu)")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override a study field (after --profile), e.g. --set train.steps=500; repeatable. "
                   "Changes the study like editing the file would")
@click.option("--dry-run", is_flag=True, help="list every run id with its resolved settings; train nothing")
@click.option("--quiet", is_flag=True, help="no progress bar: one plain line per run (for logs)")
@click.option("--executor", "executor_name", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local processes (--jobs), or one Ray task per run on a Ray cluster")
@click.option("--address", default=None, help="Ray cluster address HOST:PORT (default: a private local cluster)")
@click.option("--cpus-per-run", default=1.0, show_default=True, type=click.FloatRange(min=0),
              help="Ray: CPUs reserved for each run (also its torch threads)")
@click.option("--gpus-per-run", default=None, type=click.FloatRange(min=0),
              help="Ray: GPUs reserved for each run (default: its train.devices when it trains on a GPU of the "
                   "cluster, else 0; a fraction shares a GPU)")
@click.option("--runs-dir", default=None,
              help="where run folders (checkpoints, final weights) go; default OUT/runs. Use shared storage on a cluster")
@click.option("--reuse", multiple=True, metavar="FOLDER",
              help="another study's output folder: its finished runs with this study's run ids (the same resolved "
                   "settings, e.g. a shared baseline arm) are copied in, not trained again; repeatable")
@click.option("--reports", "reports_dir", default=None,
              help="folder that receives <study name>/ with the report when the sweep ends "
                   "(default: OUT/reports/, beside the results; the checkout's shipped reports/ only when given)")
@click.option("--allow-failures", is_flag=True,
              help="exit 0 even when runs failed or did not run (default: exit status 3)")
def run_command(study: str, out: str | None, jobs: int, fresh: bool, profile: str | None,
                overrides: tuple[str, ...], dry_run: bool, quiet: bool,
                executor_name: str, address: str | None, cpus_per_run: float, gpus_per_run: float | None,
                runs_dir: str | None, reuse: tuple[str, ...], reports_dir: str | None, allow_failures: bool) -> None:
    """Train every run of STUDY (a YAML file); finished runs in the folder are kept. Writes the
    study's report at the end. Exit status 3 when a run failed, ran out of memory or could
    not run (a diverged run is a result, not a failure), unless --allow-failures."""
    # Until the sweep begins (runner.sweeping) a signal ends the command at once: what it
    # writes by then (the lock, --fresh, the study's record) is transactional or a fresh start.
    with stopping.immediate(stopping.BEFORE_START if OWN_PROCESS else None):
        from workbench.kinds import get_kind
        from workbench.api import run_study
        from workbench.study import load_study

        if dry_run:
            study_file = load_study(study, profile, overrides)
            click.echo(get_kind(study_file.study.kind).dry_run(study_file), nl=False)
            return
        executor = None
        if executor_name == "ray":
            from workbench.run.executor_ray import RayExecutor

            executor = RayExecutor(address, cpus=cpus_per_run, gpus=gpus_per_run)
        summary = run_study(study, out, jobs=jobs, fresh=fresh, profile=profile, quiet=quiet,
                            executor=executor, runs_dir=runs_dir, overrides=overrides, reuse=reuse)
    counts = ", ".join(f"{n} {status}" for status, n in sorted(summary.statuses.items())) or "nothing to run"
    click.echo(f"{summary.total} runs in {summary.out_dir}: {counts}; {summary.skipped} already done")
    done = f"after the sweep: its {summary.total} runs are recorded in {summary.out_dir} ({counts})"
    # the report is built in a scratch folder and swapped in: a stop while it builds loses nothing
    with stopping.immediate(f"{done}; the report was not written (`workbench report {summary.out_dir}` "
                            "writes it)" if OWN_PROCESS else None):
        from workbench.api import write_report

        index = write_report(summary.out_dir, reports_dir or default_reports_dir(summary.out_dir, summary.study))
    stopping.check(f"stopped by {stopping.reason()} {done}; the report was written ({index})")
    click.echo(f"report: {index} (and {index.parent / 'report.md'})")
    if summary.incomplete and not allow_failures:
        raise RunsIncomplete(f"{summary.incomplete} of {summary.total} runs did not finish (failed, out of memory "
                             "or not run); the report shows what finished. Run the same command again to retry "
                             "them, or pass --allow-failures to exit 0 anyway")


def stored_study_name(out_dir: str | Path) -> str | None:
    from workbench.run.store import load_study_info

    return load_study_info(out_dir).get("name")


@main.command("validate")
@click.argument("study")
@click.option("--profile", default=None, help="validate with the study's named overrides applied")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override a study field (after --profile), e.g. --set train.steps=500; repeatable")
@click.option("--device", type=click.Choice(["cpu", "cuda", "mps"]), default=None,
              help="check the hardware the study needs against a machine with this device (a CUDA GPU is "
                   "taken to have bfloat16) instead of this one: what it lacks is an error")
@click.option("--address", default=None,
              help="the Ray cluster (HOST:PORT) the study will run on: its devices and nodes are not checked here")
def validate_command(study: str, profile: str | None, overrides: tuple[str, ...], device: str | None,
                     address: str | None) -> None:
    """Check STUDY and every run of its sweep, without training. Hardware this machine lacks (a
    GPU for bf16-mixed, say) is a note, not an error: the study is fine, `run` here would refuse."""
    from workbench.hardware import Machine
    from workbench.kinds import get_kind
    from workbench.study import load_study

    study_file = load_study(study, profile, overrides)
    kind = get_kind(study_file.study.kind)
    line = kind.describe(study_file)
    machine = (Machine.target(device, cluster=address is not None) if device
               else Machine.here(cluster=address is not None))
    needs = kind.hardware_needs(study_file, machine)
    refused = needs if device else [need for need in needs if need.unservable]
    if refused:
        raise WorkbenchError(refused[0].error(study_file.source_of(refused[0].field), machine))
    click.echo(line)
    for need in needs:
        click.echo(f"note: {need.note(machine)}", err=True)


@main.command("plan")
@click.argument("study")
@click.option("--pilot-seeds", default=2, show_default=True, type=click.IntRange(1, 2),
              help="seeds per group of the pilot; with 1 the noise is unknown and only the cost is planned")
@click.option("--effect", type=float, default=None,
              help="plan the entries without a margin to detect this true difference, in their metric's units")
@click.option("--effect-sd", type=float, default=None,
              help="the same in units of each metric's noise (needs no noise estimate)")
@click.option("--out", default=None, help="the pilot's folder (default: runs/<study name>-pilot/, where `workbench "
              "run` into runs/<study name>/ finds its runs and reuses them; with --out X-pilot, `run --out X` does)")
@click.option("--jobs", default=1, show_default=True, type=click.IntRange(min=1),
              help="pilot runs at once, as in `run`: give the study's own, CPU per run depends on it")
@click.option("--fresh", is_flag=True, help="discard an earlier pilot in its folder and train it again (never another study's folder)")
@click.option("--profile", default=None, help="plan the study with its named overrides applied")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override a study field (after --profile), as in `run`; repeatable")
@click.option("--quiet", is_flag=True, help="no progress bar while the pilot trains: one plain line per run")
@click.option("--from", "stored", default=None, metavar="FOLDER",
              help="plan from an earlier issue of the study instead of a pilot: the runs in FOLDER (its run "
                   "folder, or a report's shipped REPORTS/NAME/data), their noise and CPU seconds; nothing trains")
def plan_command(study: str, pilot_seeds: int, effect: float | None, effect_sd: float | None, out: str | None,
                 jobs: int, fresh: bool, profile: str | None, overrides: tuple[str, ...], quiet: bool,
                 stored: str | None) -> None:
    """Train a pilot of STUDY (its own first 1 or 2 seeds per group, in a folder of its own, which
    `workbench run STUDY` then reuses), or read an earlier issue's runs (--from), and print per
    `expect:` entry the seeds and CPU minutes its margin or --effect needs with 80% power (or
    what the study's seeds detect), and the `seeds:` line to register."""
    with stopping.immediate(stopping.BEFORE_START if OWN_PROCESS else None):
        from workbench.api import run_pilot
        from workbench.recipes.train.plan import check_effect, plan_lines, stored_pilot

        check_effect(effect, effect_sd)
        if stored is not None and (out is not None or fresh):
            raise SpecError("--from", f"{'--out' if out is not None else '--fresh'} names a pilot to train; with "
                            "--from the plan reads the stored runs and trains nothing")
        pilot = (stored_pilot(study, stored, profile, overrides) if stored is not None
                 else run_pilot(study, pilot_seeds, out, profile, overrides, jobs, fresh, quiet, cpu_from=0.0))
    with stopping.immediate(f"after the pilot: its runs are recorded in {pilot.out}, and the same command plans "
                            "from them without training again" if OWN_PROCESS else None):
        lines = plan_lines(pilot, effect, effect_sd)
    console = Console(highlight=False)
    for line in lines:  # plain lines as they are (names hold brackets), and the tables
        console.print(line, markup=False, soft_wrap=isinstance(line, str))


@main.command("prepare")
@click.argument("study")
@click.option("--profile", default=None, help="prepare for the study with its named overrides applied")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override a study field (after --profile); repeatable")
def prepare_command(study: str, profile: str | None, overrides: tuple[str, ...]) -> None:
    """Make the data of STUDY's tasks ready on disk (e.g. tokenize a corpus into shards) before a
    run needs it; what is ready is reused, and an interrupted preparation goes on where it stopped."""
    import copy

    from workbench.registry import get_variant
    from workbench.study import load_study, task_section
    from workbench.study.keys import canonical_json, set_dotted

    study_obj = load_study(study, profile, overrides).study
    sections = {}
    for point in study_obj.sweep.points() if hasattr(study_obj, "sweep") else []:
        raw = {"task": copy.deepcopy(study_obj.task)}
        for key, value in point.items():
            if key.startswith("task."):
                set_dotted(raw, key, value)
        section = task_section(raw["task"])
        sections[canonical_json(section)] = section
    for section in sections.values():
        cls = get_variant("task", section["name"])
        task = cls(cls.Params.model_validate({k: v for k, v in section.items() if k != "name"}), seed=0)
        click.echo(task.prepare() or f"{section['name']}: the task generates its data; nothing to prepare")


@main.command("results")
@click.argument("out_dir")
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
def results_command(out_dir: str, fmt: str) -> None:
    """One flat row per run of OUT_DIR: swept keys, status, final metrics, cost."""
    from workbench.run.store import load_results

    frame = load_results(out_dir)
    click.echo(frame.to_csv(index=False) if fmt == "csv" else frame.to_json(orient="records", indent=2), nl=False)


@main.command("eval")
@click.argument("run_dir")
@click.option("--lengths", required=True, metavar="N,N,...", help="evaluation lengths, e.g. 16,32,64")
@click.option("--batch-size", default=None, type=click.IntRange(min=1),
              help="sequences per evaluation batch (default: the run's train.eval_batch_size)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def eval_command(run_dir: str, lengths: str, batch_size: int | None, as_json: bool) -> None:
    """Evaluate the saved model of a finished run (RUN_DIR: runs/<study>/runs/<run id>/) at new
    lengths, without retraining; held-out sets are drawn as the run drew its own. Writes nothing."""
    from workbench.run.evaluate import evaluate_saved_run

    try:
        wanted = [int(n) for n in lengths.split(",") if n.strip()]
    except ValueError:
        raise WorkbenchError(f"--lengths: expected whole numbers separated by commas, got {lengths!r}") from None
    metrics, not_applicable, config = evaluate_saved_run(run_dir, wanted, batch_size)
    if as_json:
        click.echo(json.dumps({"metrics": metrics, "not_applicable": not_applicable}, indent=2))
        return
    table = Table(title=f"{Path(run_dir).name}: {config['task']['name']}, trained at length "
                        f"{config['task']['train_length']}", title_justify="left")
    names = list(dict.fromkeys(m.split("@")[0] for m in metrics))
    for column in ("length", *names):
        table.add_column(column, justify="right")
    for n in wanted:
        if str(n) in not_applicable:
            table.add_row(str(n), *["n/a"] * len(names))
        else:
            table.add_row(str(n), *(f"{metrics[f'{m}@{n}']:.4g}" if f"{m}@{n}" in metrics else "–" for m in names))
    Console().print(table)
    for n, why in not_applicable.items():
        click.echo(f"@{n}: {why}")


@main.command("export")
@click.argument("run_dir")
@click.argument("out")
@click.option("--to", "target", type=click.Choice(["hf"]), required=True,
              help="hf: a Hugging Face transformers folder (save_pretrained)")
def export_command(run_dir: str, out: str, target: str) -> None:
    """Write the saved model of a finished run (RUN_DIR) to OUT in another library's format. The
    run's spec must map to a reference architecture (GPT-2, Llama, Mistral, BLOOM, GPT-NeoX, BERT,
    BART, T5, OLMo 2, Qwen3, Gemma 2, Gemma 3; docs/hf.md); otherwise the first field that does not map is named, before anything
    is written. OUT holds save_pretrained's config.json and safetensors weights and, for a text
    task, its tokenizer in the model's ids (workbench.run.export). OUT must be a new or empty
    folder: it is written whole, into a temporary folder renamed into place, never through a link."""
    from workbench.results import refuse_as_new_folder

    refuse_as_new_folder(out, "OUT")  # before torch loads: a wrong OUT is named at once
    from workbench.run.export import export_hf

    click.echo(export_hf(run_dir, out))


@main.command("generate")
@click.argument("folder")
@click.argument("prompt")
@click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1, 2**16),
              help="tokens written after the prompt (fewer when the model writes <eos>)")
@click.option("--strategy", type=click.Choice(["greedy", "sample"]), default="greedy", show_default=True,
              help="greedy: the most likely token; sample: drawn from the distribution")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=None,
              help="sample: logits divided by it (< 1 sharper, > 1 flatter; default 1)")
@click.option("--top-k", type=click.IntRange(min=1), default=None, help="sample: only the k most likely tokens")
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=None,
              help="sample: only the smallest set of tokens reaching this probability (nucleus)")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**64 - 1),
              help="sample: seed of the draws")
@click.option("--json", "as_json", is_flag=True, help="also the prompt's and the new token ids, as JSON")
def generate_command(folder: str, prompt: str, max_new_tokens: int, strategy: str, temperature: float | None,
                     top_k: int | None, top_p: float | None, seed: int, as_json: bool) -> None:
    """Continue PROMPT with the language model of FOLDER: a finished run of the text_lm task
    (runs/<study>/runs/<run id>/) or its export (`workbench export --to hf`). Prints the prompt
    and its continuation, special tokens left out."""
    from workbench.run.generation import decoding, generate

    written = generate(folder, prompt, decoding(max_new_tokens, strategy, temperature, top_k, top_p), seed)
    if as_json:
        click.echo(json.dumps({"text": written.text, "prompt_ids": written.prompt_ids, "new_ids": written.new_ids}))
    else:
        click.echo(written.text)


@main.command("report")
@click.argument("out_dir")
@click.option("--out", "reports_dir", default=None,
              help="folder that receives <study name>/index.html, report.md, figures/ and results.csv "
                   "(default: OUT_DIR/reports/; for a report's shipped data REPORTS/<study name>/data, that report)")
@click.option("--no-pictures", is_flag=True, help="skip the attention heatmaps (which load each variant's weights)")
@click.option("--with-data", is_flag=True,
              help="also copy the data the report is built from into its data/ folder (the store, and the weights "
                   "its pictures load), so that `workbench report REPORT/data` rebuilds it anywhere")
def report_command(out_dir: str, reports_dir: str | None, no_pictures: bool, with_data: bool) -> None:
    """Write the comparison report of the study stored in OUT_DIR (no training)."""
    name = stored_study_name(out_dir)  # the store is checked before the report layer (pandas, seaborn) loads
    from workbench.api import write_report

    index = write_report(out_dir, reports_dir or default_reports_dir(out_dir, name),
                         pictures=not no_pictures, with_data=with_data)
    click.echo(f"report: {index} (and {index.parent / 'report.md'})")


@main.command("screenshot")
@click.argument("report")
@click.option("--out", default=None, help="the PNG to write (default: REPORT/first-screen.png)")
@click.option("--size", default="1400x900", show_default=True, help="browser window, WIDTHxHEIGHT in pixels")
def screenshot_command(report: str, out: str | None, size: str) -> None:
    """The first screen of a report (REPORT: its folder or index.html) in headless Chromium, as a PNG."""
    from workbench.report.screenshot import screenshot

    width, sep, height = size.partition("x")
    if not (sep and width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0):
        raise SpecError("--size", f"expected WIDTHxHEIGHT in pixels, e.g. 1400x900, got {size!r}")
    click.echo(f"screenshot: {screenshot(report, out, int(width), int(height))}")


@main.command("compare")
@click.argument("out_dirs", nargs=-1, required=True)
@click.option("--name", default=None, help="report name (default: the study names joined by -vs-)")
@click.option("--out", "reports_dir", default="reports", show_default=True,
              help="folder that receives <name>/index.html, report.md, figures/ and results.csv")
@click.option("--no-pictures", is_flag=True, help="skip the attention heatmaps (which load each variant's weights)")
@click.option("--baseline", default=None, metavar="VALUE",
              help="the variant the others are compared against, as a study's `baseline:` (a swept value, or a "
                   "YAML mapping {dotted.key: value}); default: the first folder's own baseline")
@click.option("--expect", "expect", multiple=True, metavar='"A > B on METRIC"',
              help="a verdict to decide, as a study's `expect:` entry: A expected better than B on METRIC "
                   "(the metric's own direction); repeatable")
def compare_command(out_dirs: tuple[str, ...], name: str | None, reports_dir: str, no_pictures: bool,
                    baseline: str | None, expect: tuple[str, ...]) -> None:
    """One report over the runs of several study folders (OUT_DIRS) of the same task, e.g. a
    variant added later against an earlier sweep. Variants are told apart by every setting
    that differs between the runs; the header names each folder with its variants. Chance
    levels, deltas and verdicts follow the same rules as a study's report."""
    from workbench.recipes.train.compare import write_comparison, yaml_value

    index = write_comparison(out_dirs, reports_dir, name, pictures=not no_pictures,
                             baseline=yaml_value(baseline) if baseline is not None else None, expect=expect)
    click.echo(f"report: {index} (and {index.parent / 'report.md'})")


@main.command("diff")
@click.argument("shipped")
@click.argument("yours")
@click.option("--tolerance", type=click.FloatRange(min=0), default=None,
              help="how far a number may move and still count as the same, in the metric's units (default: "
                   "what a change of machine moves the quickstart's accuracies by, measured: docs/guide.md)")
def diff_command(shipped: str, yours: str, tolerance: float | None) -> None:
    """How the report YOURS (e.g. runs/quickstart/reports/quickstart) differs from SHIPPED of the
    same study (reports/quickstart), verdict by verdict; exit status 1 when one changed its outcome
    or moved beyond the tolerance."""
    from workbench.report.diff import MACHINE_TOLERANCE, diff_lines

    if tolerance is not None and not math.isfinite(tolerance):
        raise SpecError("--tolerance", f"{tolerance}: a distance in the metric's units is a finite number")
    lines, same = diff_lines(shipped, yours, MACHINE_TOLERANCE if tolerance is None else tolerance)
    click.echo("\n".join(lines))
    sys.exit(0 if same else 1)


@main.command("report-index")
@click.option("--studies", "studies_dir", default="studies", show_default=True, help="folder of study YAML files")
@click.option("--reports", "reports_dir", default="reports", show_default=True,
              help="folder of written reports; the table goes to its README.md")
def report_index_command(studies_dir: str, reports_dir: str) -> None:
    """Rebuild REPORTS/README.md: every study with its question, verdicts, run time and report link."""
    from workbench.report.index import write_index

    click.echo(f"index: {write_index(studies_dir, reports_dir)}")


@main.command("new-plugin")
@click.argument("axis", type=click.Choice(AXES))
@click.argument("name")
@click.option("--dir", "parent", default=".", show_default=True, help="folder in which workbench-NAME/ is created")
def new_plugin_command(axis: str, name: str, parent: str) -> None:
    """Write an installable plugin package for a new variant NAME of AXIS: pyproject entry point,
    a working module with a documented Params class, and tests."""
    from workbench.scaffold import new_plugin

    root = new_plugin(axis, name, parent)
    # [test] installs pytest: the quickstart's environment (`make quickstart`) has none
    click.echo(f"wrote {root}/: pip install -e '{root}[test]' && python -m pytest {root}/tests")


@main.command("schema")
def schema_command() -> None:
    """The JSON Schema of study files (for editors: yaml-language-server, VS Code)."""
    from workbench.study import study_json_schema

    click.echo(json.dumps(study_json_schema(), indent=2))


if __name__ == "__main__":
    main()
