"""Tokenizers, and a corpus tokenized once into token shards on disk.

Tokenizers (the text task's `tokenizer`):

    bytes             the 256 byte values: nothing to train, nothing stored
    bpe               byte-level BPE (Sennrich et al. 2016, with GPT-2's byte-level pre-tokenizer,
                      Radford et al. 2019) trained by HuggingFace `tokenizers` on the training
                      documents only, at most `vocab_size` tokens; stored in the shard folder, so
                      every run that names the same corpus and settings reads the same tokenizer
    <file>.json       a HuggingFace `tokenizers` file the user names (e.g. a pretrained model's)

Shards follow nanoGPT's layout (`data/openwebtext/prepare.py`): `train.bin` and `val.bin`
hold every token id of a split as one flat array (readable with `np.memmap`): uint16 for
vocabularies up to 65,536 (uint32 past that), and uint8 for bytes (nanoGPT's character-level
example stores those as uint16 too; a byte needs no more, and the file is half the size), so a process keeps in memory only the pages
it touches. `meta.json`, written last (its presence means the folder is complete), records
the dtype, the vocabulary size and each split's tokens and bytes of text, and for a corpus
split by document the duplicates found before the split (`duplicates`: the documents read,
the exact and near copies removed, or under dedupe none the exact copies kept; a folder
written before it has none). The folder is
$WORKBENCH_DATA_DIR (default ~/.cache/workbench/data) / <digest of the corpus's fingerprint
and the settings>.

A shard folder is built in `.<name>.building` beside it and renamed to `<name>` once whole,
so a folder under its own name is always complete; every file is written and read without
following a link, and `meta.json` is checked (ShardMeta: a dtype of DTYPES, a vocabulary that
dtype holds, each split's file as long as its token count says) before a shard is used, as
the data folder may have been tampered with. Preparing is resumable: a split is appended to
`<split>.bin.part`, and after every batch of pieces `progress.json` records how many pieces
are done and how many tokens they gave; an interrupted preparation cuts the part file back to
that count and goes on with the next piece (a progress record out of shape starts the split
over). One process prepares a folder at a time (an fcntl lock on `.<name>.lock`); the others
wait for it and then read what it wrote.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from workbench.errors import SpecError, WorkbenchError, WorkbenchWarning, write_error
from workbench.results import Count, check_regular, first_problem, load_json, read_regular, write_text_atomic
from workbench.tasks.corpus import DEDUPE_MODES

SPECIALS = ("<pad>", "<bos>", "<eos>", "<sep>")  # model ids 0..3 in every built-in vocabulary
SPLITS = ("train", "val")
BATCH_BYTES = 8 << 20  # text tokenized between two progress records
DATA_DIR_ENV = "WORKBENCH_DATA_DIR"


def data_dir() -> Path:
    return Path(os.environ.get(DATA_DIR_ENV) or Path.home() / ".cache" / "workbench" / "data")


def byte_name(b: int) -> str:
    """Readable, unique token string of a byte (for vocab listings and heatmaps)."""
    if b == 0x20:
        return "␣"
    if b == 0x0A:
        return "\\n"
    if 0x21 <= b <= 0x7E:
        return chr(b)
    return f"<0x{b:02X}>"


class ByteTokenizer:
    """The 256 byte values, token id = byte."""

    vocab_size = 256

    def encode(self, pieces: list[bytes]) -> list[np.ndarray]:
        return [np.frombuffer(piece, dtype=np.uint8) for piece in pieces]

    def token_names(self) -> list[str]:
        return [byte_name(b) for b in range(256)]

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


MAX_TOKENIZER_BYTES = 64 * 2**20  # a large vocabulary's tokenizer.json is tens of MB


def library_failure(err: BaseException) -> bool:
    """Whether `err` is what the `tokenizers` library raises for input it cannot handle: an
    Exception, or a panic of its Rust code (pyo3's PanicException, a BaseException that passes
    `except Exception`: its regex engine panics when a pattern backtracks past its limit)."""
    return isinstance(err, Exception) or type(err).__name__ == "PanicException"


class HFTokenizer:
    """A HuggingFace `tokenizers` tokenizer (no special tokens added: the task has its own)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def load(cls, path: Path, field: str = "task.tokenizer") -> HFTokenizer:
        """The tokenizer of a tokenizer.json read as a regular file of at most MAX_TOKENIZER_BYTES;
        SpecError naming `field` for anything the library cannot read (its panics included)."""
        from tokenizers import Tokenizer

        try:
            text = read_regular(path, MAX_TOKENIZER_BYTES).decode("utf-8")  # UnsafeFile: a link, FIFO, too large
        except UnicodeDecodeError:
            raise SpecError(field, f"{path} is not a HuggingFace tokenizer.json (not UTF-8 text)") from None
        except OSError as err:
            raise SpecError(field, f"{path}: cannot read it ({err.strerror or err})") from None
        try:
            return cls(Tokenizer.from_str(text))
        except BaseException as err:  # a bare Exception for a malformed file, a PanicException for some
            if not library_failure(err):
                raise
            first = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
            raise SpecError(field, f"{path} is not a HuggingFace tokenizer.json ({first})") from None

    def encode(self, pieces: list[bytes]) -> list[np.ndarray]:
        texts = [piece.decode("utf-8", errors="replace") for piece in pieces]
        return [np.asarray(e.ids, dtype=np.uint32)
                for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]  # no offsets: faster

    def token_names(self) -> list[str]:
        return [self.tokenizer.id_to_token(i) or f"<id {i}>" for i in range(self.vocab_size)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def train_bpe(texts: Iterator[bytes], vocab_size: int) -> HFTokenizer:
    """A byte-level BPE of at most `vocab_size` tokens trained on `texts` (GPT-2's recipe:
    ByteLevel pre-tokenizer and decoder, the 256 byte symbols as the initial alphabet)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((piece.decode("utf-8", errors="replace") for piece in texts), trainer)
    return HFTokenizer(tokenizer)


@dataclass(frozen=True)
class Texts:
    """What a shard folder is made of: each split's text as pieces (a fresh iterator per call),
    its size in bytes where known (for the progress bar), a fingerprint of the corpus, and what
    was found of duplicate documents before the split (DuplicateCounts' fields; called once the
    splits are written, for meta.json)."""

    fingerprint: str
    train: Callable[[], Iterator[bytes]]
    valid: Callable[[], Iterator[bytes]]
    sizes: tuple[int | None, int | None] = (None, None)
    duplicates: Callable[[], dict] | None = None


def settings_key(texts: Texts, tokenizer: str, vocab_size: int) -> str:
    """The shard folder's name: a digest of the corpus and of what tokenizes it."""
    settings = {"corpus": texts.fingerprint, "tokenizer": tokenizer}
    if tokenizer == "bpe":
        settings["vocab_size"] = vocab_size
    elif tokenizer != "bytes":  # a named file: its content, wherever it lies
        settings["tokenizer"] = hashlib.blake2b(Path(tokenizer).read_bytes(), digest_size=16).hexdigest()
    return hashlib.blake2b(json.dumps(settings, sort_keys=True).encode(), digest_size=12).hexdigest()


class TokenFile:
    """Tokens [start, stop) of a shard file, read by slice: slicing gives another range of the
    file, `np.asarray` reads one. A long-lived `np.memmap` would keep every page training ever
    touched counted in the process's resident memory, so each read is a `pread` instead, as
    nanoGPT's `train.py` recreates its memmap for every batch for the same reason."""

    def __init__(self, path: Path, dtype: str, start: int = 0, stop: int | None = None):
        self.path, self.dtype = path, np.dtype(dtype)
        self.start = start
        self.stop = path.stat().st_size // self.dtype.itemsize if stop is None else stop
        self._fd: tuple[int, int] | None = None  # (pid, descriptor): a forked process opens its own

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, key: slice) -> TokenFile:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("a TokenFile is sliced by a contiguous range")
        start, stop, _ = key.indices(len(self))
        return TokenFile(self.path, self.dtype.name, self.start + start, self.start + max(start, stop))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        if self._fd is None or self._fd[0] != os.getpid():
            self._fd = (os.getpid(), os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW))
        size = self.dtype.itemsize
        data = os.pread(self._fd[1], len(self) * size, self.start * size)
        out = np.frombuffer(data, dtype=self.dtype)
        return out if dtype is None else out.astype(dtype)

    def __del__(self):
        if self._fd is not None and self._fd[0] == os.getpid():
            os.close(self._fd[1])

    def tobytes(self) -> bytes:
        return np.asarray(self).tobytes()


@dataclass(frozen=True)
class Shards:
    """A prepared shard folder: its tokenizer, and each split as a read-only memory map."""

    folder: Path
    meta: dict

    def tokens(self, split: str) -> TokenFile:
        return TokenFile(self.folder / f"{split}.bin", self.meta["dtype"])

    def tokens_per_byte(self, split: str) -> float:
        counts = self.meta["splits"][split]
        return counts["tokens"] / counts["bytes"] if counts["bytes"] else 1.0

    def tokenizer(self) -> ByteTokenizer | HFTokenizer:
        if self.meta["tokenizer"] == "bytes":
            return ByteTokenizer()
        path = self.folder / "tokenizer.json"
        if not check_regular(path):
            raise damaged(self.folder, "tokenizer.json is missing")
        try:
            loaded = HFTokenizer.load(path)
        except SpecError as err:
            raise damaged(self.folder, err.problem) from None
        if loaded.vocab_size != self.meta["vocab_size"]:
            raise damaged(self.folder, f"tokenizer.json has {loaded.vocab_size} tokens, meta.json says "
                                       f"{self.meta['vocab_size']}")
        return loaded


DTYPES = ("uint8", "uint16", "uint32")  # what a shard stores token ids as: the smallest that holds the vocabulary
MAX_VOCAB = 2**24  # a tokenizer's tokens: 256 bytes, or a BPE of up to 2**20 (TextParams.vocab_size), or a named file
MAX_RECORD_BYTES = 1 << 20  # meta.json and progress.json hold a few numbers


class SplitCounts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: Count
    bytes: Count


class DuplicateCounts(BaseModel):
    """The duplicate documents found before a corpus was split (workbench.tasks.corpus.Duplicates)."""

    model_config = ConfigDict(extra="forbid")
    dedupe: Literal[DEDUPE_MODES]
    documents: Count  # read
    exact: Count  # removed, or under dedupe none found and kept
    near: Count  # removed (dedupe near)

    @model_validator(mode="after")
    def _some_kept(self):
        if self.exact + self.near >= max(self.documents, 1):
            raise ValueError(f"{self.exact} exact and {self.near} near duplicates of {self.documents} documents leave "
                             "none")
        return self


class ShardMeta(BaseModel):
    """meta.json, as `prepare` writes it: checked before a shard folder is used."""

    model_config = ConfigDict(extra="forbid")
    tokenizer: Literal["bytes", "tokenizer.json"]
    vocab_size: Annotated[int, Strict(), Field(ge=1, le=MAX_VOCAB)]
    dtype: Literal[DTYPES]
    splits: dict[Literal[SPLITS], SplitCounts]
    corpus: str
    duplicates: DuplicateCounts | None = None  # absent from folders written before dedupe

    @model_validator(mode="after")
    def _consistent(self):
        if set(self.splits) != set(SPLITS):
            raise ValueError(f"splits: expected {' and '.join(SPLITS)}, got {', '.join(self.splits) or 'none'}")
        if self.vocab_size > np.iinfo(self.dtype).max + 1:
            raise ValueError(f"dtype: {self.dtype} cannot hold the ids of a vocabulary of {self.vocab_size}")
        if self.tokenizer == "bytes" and self.vocab_size != 256:
            raise ValueError(f"vocab_size: the bytes tokenizer has 256 tokens, not {self.vocab_size}")
        return self


def damaged(folder: Path, problem: str) -> WorkbenchError:
    return WorkbenchError(f"{folder}: not a shard folder the workbench wrote ({problem}); remove that folder (a run "
                          "or `workbench prepare` tokenizes the corpus again) or set WORKBENCH_DATA_DIR to another "
                          "folder")


def read_record(path: Path, what: str):
    """A small JSON record of a shard folder (meta.json, progress.json), read as a regular file."""
    return load_json(read_regular(path, MAX_RECORD_BYTES), what)


def checked_meta(folder: Path) -> dict:
    """The folder's meta.json, checked as ShardMeta and against its files (each split's `.bin` a
    regular file of `tokens` ids of `dtype`); one line naming the problem otherwise."""
    try:
        meta = ShardMeta.model_validate(read_record(folder / "meta.json", "meta.json")).model_dump()
    except ValidationError as err:
        raise damaged(folder, f"meta.json: {first_problem(err)}") from None
    except ValueError as err:
        raise damaged(folder, str(err)) from None
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split, counts in meta["splits"].items():
        shard = folder / f"{split}.bin"
        if not check_regular(shard):
            raise damaged(folder, f"{shard.name} is missing")
        if shard.stat().st_size != counts["tokens"] * itemsize:
            raise damaged(folder, f"{shard.name} holds {shard.stat().st_size} bytes, meta.json says {counts['tokens']} "
                                  f"tokens of {meta['dtype']}")
    return meta


def prepared(texts: Texts, tokenizer: str, vocab_size: int) -> Shards | None:
    """The shard folder of `texts` under `tokenizer` when it is ready, else None (nothing is written)."""
    folder = data_dir() / settings_key(texts, tokenizer, vocab_size)
    if not os.path.lexists(folder):
        return None
    if os.path.islink(folder) or not os.path.isdir(folder):
        raise damaged(folder, "not a folder, or a symbolic link")
    if not check_regular(folder / "meta.json"):
        return None  # an earlier workbench's unfinished preparation, in place: `prepare` goes on with it
    return Shards(folder, checked_meta(folder))


def prepare(texts: Texts, tokenizer: str, vocab_size: int, progress: bool = False) -> Shards:
    """The shard folder of `texts` under `tokenizer`, tokenizing (or finishing) it first if needed;
    a disk that is full or a data folder that cannot be written is one line (errors.write_error)."""
    ready = prepared(texts, tokenizer, vocab_size)
    if ready is not None:
        return ready
    name = settings_key(texts, tokenizer, vocab_size)
    folder, building = data_dir() / name, data_dir() / f".{name}.building"
    try:
        data_dir().mkdir(parents=True, exist_ok=True)
        lock = os.open(data_dir() / f".{name}.lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the descriptor closes
            ready = prepared(texts, tokenizer, vocab_size)  # another process finished it while this one waited
            if ready is not None:
                return ready
            if os.path.isdir(folder) and not os.path.lexists(building):
                os.rename(folder, building)  # an earlier workbench prepared in place: go on from what it wrote
            build(building, texts, tokenizer, vocab_size, progress)
            os.rename(building, folder)  # whole under its name, or not there; never through a link
        finally:
            os.close(lock)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise damaged(data_dir(), f"a symbolic link among the files of {name}") from None
        raise write_error(folder, err, "write the token shards",
                          f"set {DATA_DIR_ENV} to a folder this user can write") from None
    return Shards(folder, checked_meta(folder))


def build(building: Path, texts: Texts, tokenizer: str, vocab_size: int, progress: bool) -> None:
    """Tokenize `texts` into the folder `building` (going on with what an interrupted build wrote)."""
    building.mkdir(exist_ok=True)
    if os.path.islink(building) or not building.is_dir():
        raise damaged(building, "not a folder")
    encoder = shard_tokenizer(building, texts, tokenizer, vocab_size)
    dtype = next(t for t in DTYPES if encoder.vocab_size <= np.iinfo(t).max + 1)
    splits = {split: write_split(building, split, pieces, dtype, encoder, size, progress)
              for split, pieces, size in zip(SPLITS, (texts.train, texts.valid), texts.sizes)}
    meta = {"tokenizer": "bytes" if tokenizer == "bytes" else "tokenizer.json", "vocab_size": encoder.vocab_size,
            "dtype": dtype, "splits": splits, "corpus": texts.fingerprint}
    if texts.duplicates is not None:
        meta["duplicates"] = texts.duplicates()
    write_text_atomic(building / "meta.json", json.dumps(meta, indent=1))
    (building / "progress.json").unlink(missing_ok=True)


def shard_tokenizer(folder: Path, texts: Texts, tokenizer: str, vocab_size: int) -> ByteTokenizer | HFTokenizer:
    """The folder's tokenizer: bytes, the user's file (copied in), or a BPE trained on the training text once."""
    if tokenizer == "bytes":
        return ByteTokenizer()
    stored = folder / "tokenizer.json"
    if not check_regular(stored):
        if tokenizer == "bpe":
            text = train_bpe(texts.train(), vocab_size).tokenizer.to_str()
        else:
            HFTokenizer.load(Path(tokenizer))  # a clear message for a file that is no tokenizer
            text = Path(tokenizer).read_text(encoding="utf-8")
        write_text_atomic(stored, text)
    return HFTokenizer.load(stored)


def batches(pieces: Iterator[bytes], skip: int) -> Iterator[list[bytes]]:
    """Pieces after the first `skip`, in batches of about BATCH_BYTES."""
    batch: list[bytes] = []
    size = 0
    for i, piece in enumerate(pieces):
        if i < skip:
            continue
        batch.append(piece)
        size += len(piece)
        if size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def write_split(folder: Path, split: str, pieces: Callable[[], Iterator[bytes]], dtype: str,
                encoder: ByteTokenizer | HFTokenizer, size: int | None, show: bool) -> dict[str, int]:
    """Tokenize one split into `<split>.bin`, going on from `progress.json` where a run stopped."""
    record = folder / "progress.json"
    state = progress_record(folder, dtype)
    done = state.get(split, {"pieces": 0, "tokens": 0, "bytes": 0, "complete": False})
    final, part = folder / f"{split}.bin", folder / f"{split}.bin.part"
    if done["complete"] and check_regular(final):
        return {"tokens": done["tokens"], "bytes": done["bytes"]}
    itemsize = np.dtype(dtype).itemsize
    append = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    with os.fdopen(append, "ab") as out, ProgressBar(show, split, size) as (advance, start):
        out.truncate(done["tokens"] * itemsize)  # drop what was written after the last record
        start(done["bytes"])
        for batch in batches(pieces(), done["pieces"]):
            for ids in encoder.encode(batch):
                out.write(ids.astype(dtype).tobytes())
                done["tokens"] += len(ids)
            out.flush()
            done["pieces"] += len(batch)
            done["bytes"] += sum(len(p) for p in batch)
            write_text_atomic(record, json.dumps({**state, split: done}))
            advance(sum(len(p) for p in batch))
    os.replace(part, final)
    done["complete"] = True
    write_text_atomic(record, json.dumps({**state, split: done}))
    return {"tokens": done["tokens"], "bytes": done["bytes"]}


class SplitProgress(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pieces: Count
    tokens: Count
    bytes: Count
    complete: bool


def progress_record(folder: Path, dtype: str) -> dict[str, dict]:
    """progress.json of an interrupted build, each split's counts checked against its file (a
    record cannot extend a part file); one out of shape is a warning, and its build starts over."""
    path = folder / "progress.json"
    try:
        if not check_regular(path):
            return {}
        state = {split: SplitProgress.model_validate(counts).model_dump()
                 for split, counts in dict(read_record(path, "progress.json")).items() if split in SPLITS}
        for split, counts in state.items():
            file = folder / f"{split}.bin" if counts["complete"] else folder / f"{split}.bin.part"
            if not check_regular(file) or file.stat().st_size < counts["tokens"] * np.dtype(dtype).itemsize:
                raise ValueError(f"{split}: {counts['tokens']} tokens, more than {file.name} holds")
        return state
    except (ValidationError, ValueError, TypeError, WorkbenchError) as err:
        problem = first_problem(err) if isinstance(err, ValidationError) else str(err)
        warnings.warn(WorkbenchWarning(f"{path}: not a progress record the workbench wrote ({problem}); preparing "
                                       "those shards from the start"), stacklevel=2)
        for name in ("progress.json", *(f"{split}.bin{end}" for split in SPLITS for end in ("", ".part"))):
            (folder / name).unlink(missing_ok=True)
        return {}


class ProgressBar:
    """A rich progress bar over a split's bytes (nothing shown when `show` is false)."""

    def __init__(self, show: bool, split: str, total: int | None):
        self.progress = Progress(TextColumn(f"tokenizing {split}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(), disable=not show, transient=False)
        self.task = self.progress.add_task(split, total=total)

    def __enter__(self):
        self.progress.start()
        return (lambda n: self.progress.advance(self.task, n)), (lambda n: self.progress.update(self.task, completed=n))

    def __exit__(self, *exc):
        self.progress.stop()
        return False
