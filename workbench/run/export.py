"""`workbench export RUN --to hf OUT`: a finished run's saved model and its task's tokenizer in the
model's ids as a Hugging Face transformers folder (docs/hf.md)."""

from __future__ import annotations

from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.model.hf import architecture_for, import_transformers, to_hf
from workbench.model.weights import load_final_model, make_task, refuse_non_finite
from workbench.results import FINAL_WEIGHTS, write_folder_atomically
from workbench.run.store import run_folder_hint
from workbench.tasks.model_tokenizer import transformers_tokenizer


def export_hf(run_dir: str, out: str) -> str:
    """Write the run's model to OUT with save_pretrained (config.json, safetensors weights) and its
    task's tokenizer in model ids (tokenizer.json, workbench.tasks.model_tokenizer: a text task's
    id + 4 after <pad> <bos> <eos> <sep>, a symbol task's words), whole or not at all (results.write_folder_atomically). The spec must map
    to a reference architecture, or the first field that does not map is named before anything
    is written; non-finite weights are refused. Returns the line that says how to load it."""
    try:
        model, config = load_final_model(run_dir)
    except (FileNotFoundError, NotADirectoryError):
        raise WorkbenchError(f"{run_dir}: no final weights; {run_folder_hint(run_dir)}") from None
    refuse_non_finite(model, Path(run_dir) / FINAL_WEIGHTS)
    arch = architecture_for(model.spec)
    task = make_task(config)
    tokenizer = transformers_tokenizer(task.model_tokenizer())
    hf_model = to_hf(model)
    import_transformers().utils.logging.disable_progress_bar()  # its writing bar is noise in a command's output

    def write(folder: Path) -> None:
        hf_model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    write_folder_atomically(out, write)
    return (f"{out}: {arch.hf_class} ({arch.model_type}) and its tokenizer; load them with "
            f"transformers.AutoTokenizer and {arch.auto_class}.from_pretrained({out!r})")
