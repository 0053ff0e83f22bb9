"""A model folder received from elsewhere, read as data before anything generates from it
(`workbench generate FOLDER`): an export's files checked against each other, and a tokenizer's
work on received text bounded in time. Each refusal is one line naming the file.

    load_export(folder)          the transformers model of an export (`workbench export --to hf`):
                                 its JSON files bounded; config.json an architecture the workbench
                                 maps (workbench.model.hf); the safetensors weights exactly the
                                 tensors of that config's model, in its shapes, read from their
                                 headers before a weight is allocated (a config of 3000 layers over the
                                 weights of one was a minute of building random layers)
                                 and every weight finite (NaN weights generated nothing, silently)
    check_vocabulary(...)        every id the tokenizer can produce, and the pad id, inside the
                                 model's vocabulary (past it, the embedding raised IndexError)
    tokenizer_call(call, what)   a tokenizer's work on the prompt, or on what the model wrote,
                                 within TOKENIZER_SECONDS (a regex that backtracks took minutes on
                                 a short prompt), a panic of the library one line; the Rust panic
                                 message it prints is held back (tokenizer_output_held)
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch

from workbench.deadline import TimedOut, call_within
from workbench.errors import SpecError, WorkbenchError
from workbench.model.hf import ARCHITECTURES
from workbench.model.hf_architecture import Architecture, import_transformers
from workbench.model.spec import ModelSpec, parse_spec
from workbench.model.weights import refuse_non_finite
from workbench.results import check_regular, load_json, read_regular
from workbench.tasks.tokens import MAX_TOKENIZER_BYTES, library_failure

T = TypeVar("T")

TOKENIZER_FILE = "tokenizer.json"
MAX_JSON_FILE_BYTES = 2**20  # config.json and transformers' other JSON files of an export: a few kB
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}  # safetensors' names of what a model's weights are
TOKENIZER_SECONDS = 10.0  # encoding a prompt of thousands of words with a large vocabulary: milliseconds


def check_files(folder: Path) -> None:
    """Every file transformers reads here is a regular file (no link, no FIFO) and every JSON
    file is bounded JSON of a size the workbench writes, before transformers opens one; the
    tokenizer is there."""
    for path in folder.iterdir():
        if path.suffix == ".safetensors" or path.name == TOKENIZER_FILE:
            check_regular(path)
        elif path.suffix == ".json" and check_regular(path):
            try:
                load_json(read_regular(path, MAX_JSON_FILE_BYTES), path.name)
            except ValueError as err:
                raise WorkbenchError(f"{folder}/{err}; export the run again") from None
    if not check_regular(folder / TOKENIZER_FILE):
        raise WorkbenchError(f"{folder}: an export without tokenizer.json (written before exports held their "
                             "tokenizer); export the run again")


def export_config(folder: Path):
    """config.json as transformers reads it, once it names an architecture the workbench maps."""
    config = load_json(read_regular(folder / "config.json", MAX_JSON_FILE_BYTES), "config.json")
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in ARCHITECTURES:
        raise SpecError("model_type", f"{folder}/config.json names {str(model_type)[:60]!r}, no architecture the "
                        "workbench maps", ARCHITECTURES)
    transformers = import_transformers()
    try:
        with transformers_quiet(transformers):  # its warnings about the config: the checks here say what matters
            return transformers.AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except Exception as err:  # transformers raises many kinds; the first line names what it could not read
        raise WorkbenchError(f"{folder}/config.json: transformers cannot read it ({first_line(err)})") from None


@contextmanager
def transformers_quiet(transformers) -> Iterator[None]:
    """transformers' own log lines (warnings about a config value) left out while it reads a
    received folder; its errors still raise."""
    level = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.utils.logging.set_verbosity(level)


def first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__


def weight_shapes(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) of every tensor in the export's safetensors files, read from their
    headers (nothing is loaded)."""
    import safetensors

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WorkbenchError(f"{folder}: an export without safetensors weights; export the run again")
    shapes = {}
    for path in files:
        try:
            with safetensors.safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    tensor = f.get_slice(name)
                    shapes[name] = (tensor.get_dtype(), tuple(tensor.get_shape()))
        except Exception as err:  # a header that is not safetensors': the library's message
            raise WorkbenchError(f"{path}: not readable as safetensors weights ({first_line(err)})") from None
    return shapes


def saved_shapes(config, arch: Architecture, folder: Path) -> dict[str, tuple[int, ...]]:
    """The tensors transformers' `save_pretrained` writes for `config`'s model, with their shapes:
    the model built on the meta device (nothing allocated), its state dict without tied weights,
    turned back into the checkpoint format its loading converts from, as `save_pretrained` does
    (Mixtral's and OLMoE's experts one tensor per expert, where the module fuses them into one)."""
    transformers = import_transformers()
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    try:
        with torch.device("meta"), transformers_quiet(transformers):
            model = getattr(transformers, arch.hf_class)(config)
    except Exception as err:  # a config its own model cannot be built from: transformers' first line
        raise WorkbenchError(f"{folder}/config.json: transformers cannot build a {arch.hf_class} from it "
                             f"({first_line(err)})") from None
    state = revert_weight_conversion(model, remove_tied_weights_from_state_dict(model.state_dict(), model))
    return {name: tuple(tensor.shape) for name, tensor in state.items()}


def check_weights(folder: Path, config, arch: Architecture, spec: ModelSpec) -> None:
    """The weights hold exactly the tensors that config.json's model saves, floating point, in its
    shapes (`saved_shapes`). A config asking for more layers than the weights hold tensors is
    refused before even that model is built on the meta device."""
    found = weight_shapes(folder)
    if spec.n_layers > len(found):  # each layer has tensors of its own: the names below stay as many as the file's
        raise WorkbenchError(f"{folder}: config.json describes a {arch.hf_class} of {spec.n_layers} layers; the weights "
                             f"hold {len(found)} tensors in all: the config and the weights are of different models")
    expected = saved_shapes(config, arch, folder)
    missing = [name for name in expected if name not in found]
    extra = [name for name in found if name not in expected and not name.startswith(arch.unmapped)]
    layers = f"{spec.n_layers} layer{'s' * (spec.n_layers != 1)}"
    where = f"{folder}: config.json describes a {arch.hf_class} ({layers}, vocabulary {spec.vocab_size})"
    if missing:
        raise WorkbenchError(f"{where} whose {missing[0]} the weights lack{more(missing)}: the config and the weights "
                             "are of different models; export the run again")
    if extra:
        raise WorkbenchError(f"{where}, and the weights hold {extra[0]}, which it has no place for{more(extra)}: the "
                             "config and the weights are of different models; export the run again")
    for name, shape in expected.items():
        dtype, stored = found[name]
        if dtype not in FLOAT_DTYPES or stored != shape:
            raise WorkbenchError(f"{where}, whose {name} is {list(shape)}; the weights hold {dtype} {list(stored)}: "
                                 "the config and the weights are of different models")


def more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


def load_export(folder: Path):
    """The transformers model of an export folder, once its files are checked (module docstring)."""
    check_files(folder)
    config = export_config(folder)
    arch = ARCHITECTURES[config.model_type]
    if arch.auto_class != "AutoModelForCausalLM":
        raise WorkbenchError(f"{folder}: an export of a {arch.hf_class} ({arch.auto_class}); generate continues a "
                             "prompt with a decoder")
    try:
        spec = parse_spec(arch.spec(config))
    except SpecError as err:
        raise SpecError(err.field, f"{folder}/config.json: {err.problem}", err.choices) from None
    except Exception as err:  # a config field of the wrong type where the mapping reads it
        raise WorkbenchError(f"{folder}/config.json: not a {arch.hf_class} config ({first_line(err)})") from None
    check_special_ids(config, spec.vocab_size, folder)
    check_weights(folder, config, arch, spec)
    transformers = import_transformers()
    transformers.utils.logging.disable_progress_bar()  # its loading bar is noise in a command's output
    try:
        with transformers_quiet(transformers):
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True,
                                                                      trust_remote_code=False)
    except Exception as err:  # transformers raises many kinds; the first line names what it could not read
        raise WorkbenchError(f"{folder}: transformers cannot load it as a causal language model ({first_line(err)})"
                             ) from None
    refuse_non_finite(model, folder / "model.safetensors", "export the run again")
    return model


def check_special_ids(config, vocab_size: int, folder: Path) -> None:
    """config.json's pad, bos and eos ids (one each, or none) are rows of the vocabulary."""
    for field in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(config, field, None)
        if value is not None and not (isinstance(value, int) and 0 <= value < vocab_size):
            raise SpecError(field, f"{folder}/config.json: {str(value)[:40]} is not an id of the model's vocabulary "
                            f"of {vocab_size}")


def check_vocabulary(tokenizer, vocab_size: int, pad_id: int, where: Path) -> None:
    """Every id the tokenizer can produce (its vocabulary and added tokens), and `pad_id`, a row
    of the model's vocabulary of `vocab_size`."""
    ids = tokenizer.get_vocab(with_added_tokens=True)
    token, top = max(ids.items(), key=lambda item: item[1], default=("", -1))
    if top >= vocab_size:
        raise WorkbenchError(f"{where}: its tokenizer writes {token[:40]!r} as id {top}, past the model's vocabulary of "
                             f"{vocab_size}: the tokenizer is not the model's; use the one it was trained with")
    if not 0 <= pad_id < vocab_size:
        raise SpecError("pad_token_id", f"{where}: {pad_id} is outside the model's vocabulary of {vocab_size}")


@contextmanager
def tokenizer_output_held() -> Iterator[None]:
    """File descriptor 2 held in a temporary file while the library runs: a Rust panic prints its
    message (and, under RUST_BACKTRACE, a backtrace) there before pyo3 raises PanicException. What
    was held is written out when the call succeeds, and dropped when it fails (its one line says
    why)."""
    sys.stderr.flush()
    saved = os.dup(2)
    failed = False
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not failed:
                held.seek(0)
                os.write(2, held.read())


def tokenizer_call(call: Callable[[], T], what: str) -> T:
    """`call()`, the tokenizers library's work on received text, within TOKENIZER_SECONDS (its
    batch methods release the GIL, so the wait ends in time); WorkbenchError for a panic or a
    call past its time, naming `what`. An Exception of the library passes as it is."""
    try:
        with tokenizer_output_held():
            return call_within(TOKENIZER_SECONDS, call, name="tokenizer")
    except TimedOut:
        raise WorkbenchError(f"{what}: the model's tokenizer did not finish within {TOKENIZER_SECONDS:g} s (a regular "
                             "expression of its tokenizer.json that backtracks, which no tokenizer the workbench "
                             "trains has); use the tokenizer the model was trained with") from None
    except BaseException as err:
        if isinstance(err, Exception) or not library_failure(err):
            raise
        raise WorkbenchError(f"{what}: the model's tokenizer failed ({first_line(err)}); use the tokenizer the model "
                             "was trained with") from None


def bounded_encode(tokenizer, text: str) -> list[int]:
    return tokenizer_call(lambda: tokenizer.encode_batch([text])[0].ids, "PROMPT")


def bounded_decode(tokenizer, ids: list[int]) -> str:
    return tokenizer_call(lambda: tokenizer.decode_batch([ids], skip_special_tokens=True)[0], "the continuation")

