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

Both folders are received data (workbench.run.received_model): an export's config must be the
architecture of its weights, no weight may be NaN, every id the tokenizer can produce must be a
row of the model's vocabulary, and the tokenizer works on the prompt and the continuation within
a time limit. --max-new-tokens is at most MAX_NEW_TOKENS, and its KV cache at most half the
machine's memory; --seed is what torch's generator takes.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from workbench.errors import SpecError, WorkbenchError
from workbench.model.hf import from_hf
from workbench.model.position import PositionLimitError
from workbench.model.sampling import GenerationConfig
from workbench.model.transformer import DecoderModel
from workbench.model.weights import load_final_model, make_task, refuse_non_finite
from workbench.results import FINAL_WEIGHTS, OLD_FINAL_WEIGHTS, check_regular
from workbench.run.received_model import TOKENIZER_FILE, bounded_decode, bounded_encode, check_vocabulary
from workbench.run.received_model import load_export
from workbench.run.store import run_folder_hint
from workbench.tasks import SPECIALS
from workbench.tasks.tokens import HFTokenizer


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


MAX_NEW_TOKENS = 2**16  # past the positions of any model the workbench trains (hundreds to thousands)
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed's range


def decoding(max_new_tokens: int, strategy: str = "greedy", temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None) -> GenerationConfig:
    """The settings of a continuation; a sampling option with greedy decoding is refused (it
    would change nothing), naming the option, as is a length past MAX_NEW_TOKENS."""
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise SpecError("--max-new-tokens", f"{max_new_tokens}: give 1 to {MAX_NEW_TOKENS}")
    given = {"--temperature": temperature, "--top-k": top_k, "--top-p": top_p}
    if strategy == "greedy" and any(v is not None for v in given.values()):
        option = next(name for name, v in given.items() if v is not None)
        raise SpecError(option, "applies to --strategy sample (greedy takes the most likely token)")
    return GenerationConfig(max_new_tokens, strategy, 1.0 if temperature is None else temperature, top_k, top_p)


def load_language_model(folder: str | Path) -> LanguageModel:
    """The model of a finished run folder or of an export folder, checked as received data
    (workbench.run.received_model.check_language_model); one WorkbenchError line for anything
    else, or for a model that is not a decoder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise WorkbenchError(f"{folder}: no such folder (give a finished run folder, runs/<study>/runs/<run id>/, "
                             "or a folder written by `workbench export --to hf`)")
    if check_regular(folder / FINAL_WEIGHTS) or check_regular(folder / OLD_FINAL_WEIGHTS):
        lm = run_language_model(folder)
    elif check_regular(folder / "config.json"):
        lm = exported_language_model(folder)
    else:
        raise WorkbenchError(f"{folder}: neither a finished run folder (no {FINAL_WEIGHTS}) nor an export (no "
                             f"config.json); {run_folder_hint(folder)} or a folder of `workbench export --to hf`")
    check_vocabulary(lm.tokenizer, lm.model.spec.vocab_size, lm.pad_id, folder)
    return lm


def run_language_model(folder: Path) -> LanguageModel:
    model, config = load_final_model(folder)
    refuse_non_finite(model, folder / FINAL_WEIGHTS)
    if config["model"].get("family") != "decoder":
        raise WorkbenchError(f"{folder}: its model.family is {config['model'].get('family')!r} (trained on "
                             f"{config['task'].get('name')!r}); generate continues a prompt with a decoder")
    task = make_task(config)
    return LanguageModel(model, task.model_tokenizer(), task.eos_id, task.pad_id)


def exported_language_model(folder: Path) -> LanguageModel:
    hf = load_export(folder)
    eos = hf.config.eos_token_id
    if isinstance(eos, list):
        raise SpecError("eos_token_id", f"{folder}/config.json lists several ({eos}); the workbench stops at one")
    tokenizer = HFTokenizer.load(folder / TOKENIZER_FILE, TOKENIZER_FILE).tokenizer
    pad = hf.config.pad_token_id
    return LanguageModel(from_hf(hf), tokenizer, eos, SPECIALS.index("<pad>") if pad is None else pad)


def generate(folder: str | Path, prompt: str, settings: GenerationConfig, seed: int = 0) -> Continuation:
    """`continue_text` with the model of `folder` (an empty prompt is refused before it loads)."""
    if not prompt:
        raise WorkbenchError("PROMPT: empty; give the text the model should continue")
    if not 0 <= seed <= MAX_SEED:
        raise SpecError("--seed", f"{seed}: give 0 to {MAX_SEED}")
    return continue_text(load_language_model(folder), prompt, settings, seed)


def continue_text(lm: LanguageModel, prompt: str, settings: GenerationConfig, seed: int = 0) -> Continuation:
    """The model's continuation of `prompt` (sampling draws from a generator seeded with `seed`)."""
    try:
        ids = bounded_encode(lm.tokenizer, prompt)
    except WorkbenchError:
        raise
    except Exception as err:  # tokenizers raises a bare Exception, e.g. a word a word-level vocabulary lacks
        raise WorkbenchError(f"PROMPT: {prompt!r} cannot be read by the model's tokenizer ({err}); a symbol task's "
                             f"prompt is words of its vocabulary apart by whitespace: {known_words(lm.tokenizer)}") from None
    if not ids:
        raise WorkbenchError(f"PROMPT: {prompt!r} is no tokens to the model's tokenizer; give text to continue")
    check_cache_memory(lm.model, len(ids), settings.max_new_tokens)
    settings = replace(settings, eos_id=lm.eos_id, pad_id=lm.pad_id)
    try:
        out = lm.model.generate(torch.tensor([ids]), **asdict(settings), generator=torch.Generator().manual_seed(seed))
    except PositionLimitError as err:
        raise WorkbenchError(f"the prompt's {len(ids)} tokens and --max-new-tokens {settings.max_new_tokens} pass "
                             f"the model's positions ({err}): ask for fewer") from None
    new = out[0, len(ids):].tolist()
    return Continuation(bounded_decode(lm.tokenizer, ids + new), ids, new)


def check_cache_memory(model: DecoderModel, prompt: int, new: int) -> None:
    """Refuse a continuation whose KV cache (keys and values of every layer at every position,
    allocated when decoding starts: workbench.model.cache) would take over half this machine's memory."""
    spec, element = model.spec, next(model.parameters()).element_size()
    needed = 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * (prompt + new) * element
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > memory / 2:
        raise SpecError("--max-new-tokens", f"{new}: the KV cache of the prompt's {prompt} tokens and {new} new ones "
                        f"would take {needed / 2**30:.3g} GiB, over half of this machine's {memory / 2**30:.3g} GiB; "
                        "ask for fewer")


def known_words(tokenizer, shown: int = 40) -> str:
    """The tokenizer's vocabulary by id, the first `shown` of them when it is longer."""
    words = sorted(tokenizer.get_vocab(), key=tokenizer.token_to_id)
    more = f" ... ({len(words)} in all)" if len(words) > shown else ""
    return " ".join(words[:shown]) + more
