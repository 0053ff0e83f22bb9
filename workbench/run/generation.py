"""`workbench generate FOLDER PROMPT`: a decoder's continuation of a prompt, from a finished run
folder or from its export (`workbench export --to hf`), decoded as the text task's decoding
metrics decode (workbench.model.sampling: greedy, or sampling with temperature, top-k,
top-p; the KV cache), until `max_new_tokens` or <eos>.

A run folder's model reads the prompt through its task's tokenizer in model ids
(workbench.tasks.model_tokenizer): text for a text task, the task's words apart by whitespace
for a symbol task (a reversal decoder answers `<bos> a b c <sep>`). An export folder is read as transformers reads it
(config.json, safetensors weights; never pickled weights, never code) with its tokenizer.json,
and its model made a workbench model again (workbench.model.hf.from_hf), so that both continue
through the same code; its config's eos and pad ids are used. The text is the prompt's tokens
and the new ones decoded together, special tokens left out: what transformers' text-generation
pipeline returns (`return_full_text`) for the same tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from workbench.errors import SpecError, WorkbenchError
from workbench.model.hf import from_hf, import_transformers
from workbench.model.position import PositionLimitError
from workbench.model.sampling import GenerationConfig
from workbench.model.transformer import DecoderModel
from workbench.model.weights import load_final_model, make_task
from workbench.results import FINAL_WEIGHTS, OLD_FINAL_WEIGHTS, check_regular
from workbench.run.store import run_folder_hint
from workbench.tasks import SPECIALS
from workbench.tasks.tokens import HFTokenizer

EXPORT_FILES = (".json", ".safetensors")  # what transformers reads from an export folder


@dataclass(frozen=True)
class LanguageModel:
    """A decoder and the tokenizer in its ids (`tokenizers.Tokenizer`)."""

    model: DecoderModel
    tokenizer: object
    eos_id: int | None
    pad_id: int


@dataclass(frozen=True)
class Continuation:
    text: str  # the prompt's and the new tokens' text, special tokens left out
    prompt_ids: list[int]
    new_ids: list[int]  # ending with eos when the model wrote it


def decoding(max_new_tokens: int, strategy: str = "greedy", temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None) -> GenerationConfig:
    """The settings of a continuation; a sampling option with greedy decoding is refused (it
    would change nothing), naming the option."""
    given = {"--temperature": temperature, "--top-k": top_k, "--top-p": top_p}
    if strategy == "greedy" and any(v is not None for v in given.values()):
        option = next(name for name, v in given.items() if v is not None)
        raise SpecError(option, "applies to --strategy sample (greedy takes the most likely token)")
    return GenerationConfig(max_new_tokens, strategy, 1.0 if temperature is None else temperature, top_k, top_p)


def load_language_model(folder: str | Path) -> LanguageModel:
    """The model of a finished run folder or of an export folder; one WorkbenchError line for
    anything else, or for a model that is not a decoder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise WorkbenchError(f"{folder}: no such folder (give a finished run folder, runs/<study>/runs/<run id>/, "
                             "or a folder written by `workbench export --to hf`)")
    if check_regular(folder / FINAL_WEIGHTS) or check_regular(folder / OLD_FINAL_WEIGHTS):
        return run_language_model(folder)
    if check_regular(folder / "config.json"):
        return exported_language_model(folder)
    raise WorkbenchError(f"{folder}: neither a finished run folder (no {FINAL_WEIGHTS}) nor an export (no "
                         f"config.json); {run_folder_hint(folder)} or a folder of `workbench export --to hf`")


def run_language_model(folder: Path) -> LanguageModel:
    model, config = load_final_model(folder)
    if config["model"].get("family") != "decoder":
        raise WorkbenchError(f"{folder}: its model.family is {config['model'].get('family')!r} (trained on "
                             f"{config['task'].get('name')!r}); generate continues a prompt with a decoder")
    task = make_task(config)
    return LanguageModel(model, task.model_tokenizer(), task.eos_id, task.pad_id)


def exported_language_model(folder: Path) -> LanguageModel:
    for path in folder.iterdir():
        if path.suffix in EXPORT_FILES:
            check_regular(path)  # a link or FIFO is refused before transformers opens it
    if not check_regular(folder / "tokenizer.json"):
        raise WorkbenchError(f"{folder}: an export without tokenizer.json (written before exports held their "
                             "tokenizer); export the run again")
    transformers = import_transformers()
    transformers.utils.logging.disable_progress_bar()  # its loading bar is noise in a command's output
    try:
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True, trust_remote_code=False)
    except Exception as err:  # transformers raises many kinds; the first line names what it could not read
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WorkbenchError(f"{folder}: transformers cannot load it as a causal language model ({first})") from None
    eos = hf.config.eos_token_id
    if isinstance(eos, list):
        raise SpecError("eos_token_id", f"{folder}/config.json lists several ({eos}); the workbench stops at one")
    tokenizer = HFTokenizer.load(folder / "tokenizer.json", "tokenizer.json").tokenizer
    pad = hf.config.pad_token_id
    return LanguageModel(from_hf(hf), tokenizer, eos, SPECIALS.index("<pad>") if pad is None else pad)


def generate(folder: str | Path, prompt: str, settings: GenerationConfig, seed: int = 0) -> Continuation:
    """`continue_text` with the model of `folder` (an empty prompt is refused before it loads)."""
    if not prompt:
        raise WorkbenchError("PROMPT: empty; give the text the model should continue")
    return continue_text(load_language_model(folder), prompt, settings, seed)


def continue_text(lm: LanguageModel, prompt: str, settings: GenerationConfig, seed: int = 0) -> Continuation:
    """The model's continuation of `prompt` (sampling draws from a generator seeded with `seed`)."""
    try:
        ids = lm.tokenizer.encode(prompt).ids
    except Exception as err:  # tokenizers raises a bare Exception, e.g. a word a word-level vocabulary lacks
        raise WorkbenchError(f"PROMPT: {prompt!r} cannot be read by the model's tokenizer ({err}); a symbol task's "
                             f"prompt is words of its vocabulary apart by whitespace: {known_words(lm.tokenizer)}") from None
    if not ids:
        raise WorkbenchError(f"PROMPT: {prompt!r} is no tokens to the model's tokenizer; give text to continue")
    settings = replace(settings, eos_id=lm.eos_id, pad_id=lm.pad_id)
    try:
        out = lm.model.generate(torch.tensor([ids]), **asdict(settings), generator=torch.Generator().manual_seed(seed))
    except PositionLimitError as err:
        raise WorkbenchError(f"the prompt's {len(ids)} tokens and --max-new-tokens {settings.max_new_tokens} pass "
                             f"the model's positions ({err}): ask for fewer") from None
    new = out[0, len(ids):].tolist()
    return Continuation(lm.tokenizer.decode(ids + new, skip_special_tokens=True), ids, new)


def known_words(tokenizer, shown: int = 40) -> str:
    """The tokenizer's vocabulary by id, the first `shown` of them when it is longer."""
    words = sorted(tokenizer.get_vocab(), key=tokenizer.token_to_id)
    more = f" ... ({len(words)} in all)" if len(words) > shown else ""
    return " ".join(words[:shown]) + more
