"""`workbench export RUN --to hf OUT`: a finished run's saved model (and, for a text task, its
tokenizer in the model's ids) as a Hugging Face transformers folder (docs/hf.md)."""

from __future__ import annotations

from workbench.errors import WorkbenchError
from workbench.model.hf import architecture_for, import_transformers, to_hf
from workbench.model.weights import load_final_model, make_task
from workbench.tasks.model_tokenizer import TextTokens, transformers_tokenizer


def export_hf(run_dir: str, out: str) -> str:
    """Write the run's model to OUT with save_pretrained (config.json, safetensors weights) and,
    for a text task, its tokenizer (tokenizer.json: model id = tokenizer id + 4, after <pad>
    <bos> <eos> <sep>). The spec must map to a reference architecture, or the first field that
    does not map is named before anything is written. Returns the line that says how to load it."""
    try:
        model, config = load_final_model(run_dir)
    except FileNotFoundError:
        raise WorkbenchError(f"{run_dir}: no final weights (a finished run folder: runs/<study>/runs/<run id>/)") from None
    arch = architecture_for(model.spec)
    task = make_task(config)
    tokenizer = transformers_tokenizer(task.model_tokenizer()) if isinstance(task, TextTokens) else None
    import_transformers().utils.logging.disable_progress_bar()  # its writing bar is noise in a command's output
    to_hf(model).save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    loads = f"AutoTokenizer and {arch.auto_class}" if tokenizer is not None else arch.auto_class
    return (f"{out}: {arch.hf_class} ({arch.model_type}){' and its tokenizer' if tokenizer else ''}; load it with "
            f"transformers.{loads}.from_pretrained({out!r})")
