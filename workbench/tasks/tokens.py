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
the dtype, the vocabulary size and each split's tokens and bytes of text. The folder is
$WORKBENCH_DATA_DIR (default ~/.cache/workbench/data) / <digest of the corpus's fingerprint
and the settings>.

Preparing is resumable: a split is appended to `<split>.bin.part`, and after every batch of
pieces `progress.json` records how many pieces are done and how many tokens they gave; an
interrupted preparation cuts the part file back to that count and goes on with the next
piece. One process prepares a folder at a time (an fcntl lock); the others wait for it and
then read what it wrote.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from workbench.errors import SpecError

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


class HFTokenizer:
    """A HuggingFace `tokenizers` tokenizer (no special tokens added: the task has its own)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def load(cls, path: Path, field: str = "task.tokenizer") -> HFTokenizer:
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as err:  # the library raises a bare Exception for a malformed file
            raise SpecError(field, f"{path} is not a HuggingFace tokenizer.json ({str(err).splitlines()[0]})") from None

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
    its size in bytes where known (for the progress bar), and a fingerprint of the corpus."""

    fingerprint: str
    train: Callable[[], Iterator[bytes]]
    valid: Callable[[], Iterator[bytes]]
    sizes: tuple[int | None, int | None] = (None, None)


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
            self._fd = (os.getpid(), os.open(self.path, os.O_RDONLY))
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
        name = self.meta["tokenizer"]
        return ByteTokenizer() if name == "bytes" else HFTokenizer.load(self.folder / "tokenizer.json")


def prepared(texts: Texts, tokenizer: str, vocab_size: int) -> Shards | None:
    """The shard folder of `texts` under `tokenizer` when it is ready, else None (nothing is written)."""
    folder = data_dir() / settings_key(texts, tokenizer, vocab_size)
    if (folder / "meta.json").is_file():
        return Shards(folder, json.loads((folder / "meta.json").read_text()))
    return None


def prepare(texts: Texts, tokenizer: str, vocab_size: int, progress: bool = False) -> Shards:
    """The shard folder of `texts` under `tokenizer`, tokenizing (or finishing) it first if needed."""
    ready = prepared(texts, tokenizer, vocab_size)
    if ready is not None:
        return ready
    folder = data_dir() / settings_key(texts, tokenizer, vocab_size)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (folder / "meta.json").is_file():  # another process finished it while this one waited
            return Shards(folder, json.loads((folder / "meta.json").read_text()))
        encoder = shard_tokenizer(folder, texts, tokenizer, vocab_size)
        dtype = next(t for t in ("uint8", "uint16", "uint32") if encoder.vocab_size <= np.iinfo(t).max + 1)
        splits = {split: write_split(folder, split, pieces, dtype, encoder, size, progress)
                  for split, pieces, size in zip(SPLITS, (texts.train, texts.valid), texts.sizes)}
        meta = {"tokenizer": "bytes" if tokenizer == "bytes" else "tokenizer.json", "vocab_size": encoder.vocab_size,
                "dtype": dtype, "splits": splits, "corpus": texts.fingerprint}
        write_json(folder / "meta.json", meta)
        (folder / "progress.json").unlink(missing_ok=True)
    return Shards(folder, meta)


def shard_tokenizer(folder: Path, texts: Texts, tokenizer: str, vocab_size: int) -> ByteTokenizer | HFTokenizer:
    """The folder's tokenizer: bytes, the user's file (copied in), or a BPE trained on the training text once."""
    if tokenizer == "bytes":
        return ByteTokenizer()
    stored = folder / "tokenizer.json"
    if not stored.is_file():
        if tokenizer == "bpe":
            trained = train_bpe(texts.train(), vocab_size)
            trained.tokenizer.save(str(stored.with_suffix(".tmp")))
        else:
            HFTokenizer.load(Path(tokenizer))  # a clear message for a file that is no tokenizer
            stored.with_suffix(".tmp").write_bytes(Path(tokenizer).read_bytes())
        os.replace(stored.with_suffix(".tmp"), stored)
    return HFTokenizer.load(stored)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


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
    state = json.loads(record.read_text()) if record.is_file() else {}
    done = state.get(split, {"pieces": 0, "tokens": 0, "bytes": 0, "complete": False})
    final, part = folder / f"{split}.bin", folder / f"{split}.bin.part"
    if done["complete"] and final.is_file():
        return {"tokens": done["tokens"], "bytes": done["bytes"]}
    itemsize = np.dtype(dtype).itemsize
    with open(part, "ab") as out, ProgressBar(show, split, size) as (advance, start):
        out.truncate(done["tokens"] * itemsize)  # drop what was written after the last record
        start(done["bytes"])
        for batch in batches(pieces(), done["pieces"]):
            for ids in encoder.encode(batch):
                out.write(ids.astype(dtype).tobytes())
                done["tokens"] += len(ids)
            out.flush()
            done["pieces"] += len(batch)
            done["bytes"] += sum(len(p) for p in batch)
            write_json(record, {**state, split: done})
            advance(sum(len(p) for p in batch))
    os.replace(part, final)
    done["complete"] = True
    write_json(record, {**state, split: done})
    return {"tokens": done["tokens"], "bytes": done["bytes"]}


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
