"""text_lm: byte-level language modelling on a text file, or on Python's own source code.

Tokens are the 256 byte values (after the shared specials); a row is a window of
`train_length` consecutive bytes, and every byte after the first is predicted from the
ones before it. bpc is bits per byte (= per character for ASCII text): mean loss / ln 2.

Default corpus, present on every machine with Python and needing no download: the files
in TRAIN_FILES and VALID_FILES below, read from the running interpreter's standard library
(`sysconfig.get_paths()["stdlib"]`). The split is by file, so validation code is code the
model never saw. With `path:` the corpus is that one file; its last `valid_fraction` of
bytes is the validation text. Evaluation windows are `n_eval` windows spread evenly over
the validation text (the same for every seed); training windows start at random offsets.
"""

from __future__ import annotations

import math
import pathlib
import sysconfig

import numpy as np
from pydantic import Field

from workbench import hookimpl
from workbench.errors import SpecError, WorkbenchError
from workbench.tasks import Example, Task, TaskParams

# Plain-file stdlib modules present in CPython 3.10 to 3.13 (~1.1 MB train, ~0.1 MB valid).
TRAIN_FILES = (
    "argparse.py", "ast.py", "calendar.py", "configparser.py", "contextlib.py", "csv.py",
    "dataclasses.py", "difflib.py", "enum.py", "fractions.py", "functools.py", "heapq.py",
    "inspect.py", "random.py", "shutil.py", "string.py", "tempfile.py", "textwrap.py",
    "threading.py", "traceback.py", "weakref.py",
)
VALID_FILES = ("copy.py", "pprint.py", "queue.py", "statistics.py", "tokenize.py")


def byte_name(b: int) -> str:
    """Readable, unique token string of a byte (for vocab listings and heatmaps)."""
    if b == 0x20:
        return "␣"
    if b == 0x0A:
        return "\\n"
    if 0x21 <= b <= 0x7E:
        return chr(b)
    return f"<0x{b:02X}>"


def read_files(root: pathlib.Path, names: tuple[str, ...]) -> np.ndarray:
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise WorkbenchError(
            f"task text_lm: the default corpus needs {', '.join(missing)} under {root}; "
            "this Python lacks them, so set task.path to a text file"
        )
    return np.frombuffer(b"\n".join((root / n).read_bytes() for n in names), dtype=np.uint8)


class TextParams(TaskParams):
    train_length: int = Field(128, ge=2, description="bytes per training window (the model's sequence length)")
    path: str | None = Field(None, description="a text file to model; default: Python stdlib sources (see module)")
    valid_fraction: float = Field(0.1, gt=0, lt=1, description="with path: share of the file (its end) held out")


class TextLM(Task):
    """Byte-level language model on a text file (default: Python's stdlib sources)."""

    name = "text_lm"
    Params = TextParams
    families = ("decoder",)
    metrics = {"bpc": False, "perplexity": False}
    hold_out = False  # the split is by file (or by position in the file), not by example

    def __init__(self, params: TextParams, **kw):
        super().__init__(params, **kw)
        self._set_vocab([byte_name(b) for b in range(256)])
        self.first_byte = self.token_id[byte_name(0)]
        self.train_text, self.valid_text = self._load()

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        if self.params.path is None:
            root = pathlib.Path(sysconfig.get_paths()["stdlib"])
            return read_files(root, TRAIN_FILES), read_files(root, VALID_FILES)
        path = pathlib.Path(self.params.path).expanduser()
        if not path.is_file():
            raise SpecError("task.path", f"no such file: {path}")
        data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        cut = int(len(data) * (1 - self.params.valid_fraction))
        return data[:cut], data[cut:]

    def _window(self, text: np.ndarray, start: int, length: int) -> Example:
        return Example((), tuple((text[start: start + length].astype(np.int64) + self.first_byte).tolist()))

    def _check_fits(self, text: np.ndarray, length: int, which: str) -> None:
        if len(text) < length:
            raise WorkbenchError(f"task text_lm: the {which} text has {len(text)} bytes, fewer than length {length}")

    def example(self, rng, length, training):
        text = self.train_text if training else self.valid_text
        self._check_fits(text, length, "training" if training else "validation")
        return self._window(text, int(rng.integers(0, len(text) - length + 1)), length)

    def eval_examples(self, length):
        if length not in self._eval_cache:
            self._check_fits(self.valid_text, length, "validation")
            starts = np.linspace(0, len(self.valid_text) - length, self.params.n_eval).astype(int)
            self._eval_cache[length] = [self._window(self.valid_text, int(s), length) for s in starts]
        return self._eval_cache[length]

    def format_decoder(self, ex):
        return list(ex.target), [False] + [True] * (len(ex.target) - 1)

    def extra_metrics(self, model, batches, family, scores):
        return {"bpc": scores["loss"] / math.log(2), "perplexity": math.exp(scores["loss"])}


@hookimpl
def register_tasks():
    return [TextLM]
