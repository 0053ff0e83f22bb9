"""Text corpora: where a language model's documents come from, and their split by document.

A source is named by one `path` (absolute; the study loader resolves a relative one against
the study file's folder):

    a text file          one document (split by position: its last `valid_fraction` of bytes)
    a folder             every file under it, recursively (hidden ones skipped), by the rules here
    a glob               every file it matches (`corpus/**/*.md`)
    *.jsonl / *.json     one document per line: the record's `text_field` (JSON Lines)
    *.parquet            one document per row of the `text_field` column (read in record batches)
    a `datasets` folder  one saved by HuggingFace `datasets`' `save_to_disk` (a Dataset or
                         every split of a DatasetDict): one document per row's `text_field`

Every other file is read as text, one document. jsonl and parquet are read here directly
(json, pyarrow), which is what `datasets.load_dataset("json" | "parquet", data_files=...)`
would load; `datasets` itself is needed only for a saved dataset (`pip install
'transformer-workbench[data]'`).

The split is by document, never inside one: the validation documents are the
ceil(valid_fraction * N) whose BLAKE2b hash of their name (file path relative to the source,
plus the record's index) is smallest, a fixed pseudo-random draw that does not depend on
the order files are listed in. A corpus of one plain text file is one document, so it is cut
by position as before.

A document is read in pieces of about PIECE_BYTES, cut after a line break, so a corpus of
gigabytes is never held in memory whole.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import SpecError, WorkbenchError
from workbench.results import file_kind, load_json

PIECE_BYTES = 1 << 20
RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")
DATASETS_MARKERS = ("dataset_info.json", "dataset_dict.json")  # what save_to_disk writes


@dataclass(frozen=True)
class Document:
    """One document of a source: a file, or one record (`index`) of a records file."""

    file: Path
    name: str  # relative to the source: the split draws on it
    index: int | None = None  # the record's index in its file; None: the whole file


MAX_FILES = 1_000_000  # files of one corpus: past this, `path` names far more than a corpus (`/`, say)


def check_kind(path: Path) -> None:
    """SpecError unless `path` (a link followed: a corpus may be linked in) is a regular file or a
    folder: opening a FIFO blocks, and a device such as /dev/zero never ends."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return  # named as missing by files()
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise SpecError("task.path", f"{path} is a {file_kind(mode)}, not a file or folder of text; name the corpus "
                                     "file or folder itself")


def has_wildcard(path: str) -> bool:
    return any(c in path for c in "*?[")


def names_anything(path: str) -> bool:
    """Whether `path` is a file or folder here, or a glob that matches at least one file."""
    if not has_wildcard(path):
        return os.path.exists(path)
    return any(Path(p).is_file() for p in glob.iglob(path, recursive=True))


def is_datasets_folder(path: Path) -> bool:
    return path.is_dir() and any((path / marker).is_file() for marker in DATASETS_MARKERS)


@dataclass(frozen=True)
class Source:
    """The documents under one `path`, and the field that holds a record's text."""

    path: str
    text_field: str = "text"

    def files(self) -> list[Path]:
        """The files of the source, sorted (a saved `datasets` folder is one entry); one line for a
        path that is no file or folder of text (a FIFO, a device: a link to /dev/zero), a folder
        this user cannot read, or more than MAX_FILES files."""
        path = Path(self.path)
        try:
            if not has_wildcard(self.path):
                check_kind(path)
            if path.is_file() or is_datasets_folder(path):
                return [path]
            if path.is_dir():
                found = (p for p in path.rglob("*") if not any(part.startswith(".") for part in p.relative_to(path).parts)
                         and p.is_file())
            else:
                found = (Path(p) for p in glob.iglob(self.path, recursive=True) if Path(p).is_file())
            listed = list(itertools.islice(found, MAX_FILES + 1))
        except OSError as err:
            raise SpecError("task.path", f"cannot read {err.filename or self.path} ({err.strerror}); a corpus is a file "
                                         "or folder this user can read") from None
        if not listed:
            raise SpecError("task.path", f"no such file, folder or matching files: {self.path}")
        if len(listed) > MAX_FILES:
            raise SpecError("task.path", f"{self.path} holds over {MAX_FILES:,} files; name the folder of the corpus "
                                         "(or a glob of its files)")
        return sorted(listed)

    def root(self) -> Path:
        """The folder document names are relative to."""
        path = Path(self.path)
        if path.is_dir():
            return path
        if path.is_file():
            return path.parent
        parts = Path(self.path).parts
        fixed = next(i for i, part in enumerate(parts) if has_wildcard(part))
        return Path(*parts[:fixed])  # the glob's folders before its first wildcard

    def fingerprint(self) -> str:
        """A digest of what the source holds: each file's name, size and modification time (a
        changed file means a new tokenization), and the text field."""
        digest = hashlib.blake2b(self.text_field.encode(), digest_size=16)
        for file in self.files():
            stats = [os.stat(f) for f in ([file] if file.is_file() else sorted(file.rglob("*")))]
            digest.update(f"{file}|{[(s.st_size, s.st_mtime_ns) for s in stats]}\n".encode())
        return digest.hexdigest()

    def documents(self) -> list[Document]:
        documents = []
        root = self.root()
        for file in self.files():
            name = str(file.relative_to(root)) if file.is_relative_to(root) else str(file)
            if is_datasets_folder(file) or file.suffix in RECORD_SUFFIXES:
                documents += [Document(file, f"{name}#{i}", i) for i in range(record_count(file, self.text_field))]
            else:
                documents.append(Document(file, name))
        return documents

    def split(self, valid_fraction: float) -> tuple[list[Document], list[Document]] | None:
        """(training, validation) documents; None for a corpus of one plain text file (cut by position)."""
        documents = self.documents()
        if len(documents) == 1 and documents[0].index is None:
            return None
        if len(documents) < 2:
            raise WorkbenchError(f"task.path: {self.path} holds {len(documents)} document(s); a split by document "
                                 "needs at least 2")
        ranked = sorted(documents, key=lambda d: hashlib.blake2b(d.name.encode(), digest_size=8).digest())
        n_valid = min(len(documents) - 1, math.ceil(valid_fraction * len(documents)))
        valid = set(ranked[:n_valid])
        return [d for d in documents if d not in valid], [d for d in documents if d in valid]

    def split_bytes(self, valid_fraction: float) -> tuple[int, int]:
        """Upper bounds of the (training, validation) text in bytes, from file sizes alone
        (nothing is read): exact for files split by document and for one file cut by position;
        where records are split, the files' total bounds each split (their count is unread)."""
        files = self.files()
        if any(is_datasets_folder(f) or f.suffix in RECORD_SUFFIXES for f in files):
            total = sum(p.stat().st_size for f in files for p in ([f] if f.is_file() else f.rglob("*")) if p.is_file())
            return total, total
        split = self.split(valid_fraction)
        if split is None:
            size = files[0].stat().st_size
            cut = int(size * (1 - valid_fraction))  # as source_texts cuts it
            return cut, size - cut
        return tuple(sum(d.file.stat().st_size for d in docs) for docs in split)


def record_count(file: Path, field: str) -> int:
    """Records in a jsonl / parquet file or a saved dataset (checking that they have `field`)."""
    if file.suffix == ".parquet":
        meta = parquet_file(file)
        if field not in meta.schema_arrow.names:
            raise SpecError("task.text_field", f"{file} has no column {field!r}", meta.schema_arrow.names)
        return meta.metadata.num_rows
    if is_datasets_folder(file):
        return sum(len(part) for part in dataset_parts(file, field))
    with open(file, "rb") as lines:
        return sum(1 for line in lines if line.strip())


def parquet_file(file: Path):
    """pyarrow's ParquetFile of `file`; a file that is not Parquet is one line naming it."""
    import pyarrow
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(file)
    except (pyarrow.ArrowException, OSError) as err:
        raise SpecError("task.path", f"{file} is not a readable Parquet file ({str(err).splitlines()[0][:200]})") from None


def json_record(line: bytes, file: Path, number: int, field: str) -> dict:
    """Line `number` of a JSON Lines file as its record: one JSON object with `field`."""
    try:
        record = load_json(line, f"{file}: line {number}")
    except ValueError as err:
        raise SpecError("task.path", f"{err}; each line of a JSON Lines file is one JSON object (UTF-8) with the "
                                     f"field {field!r}") from None
    if not isinstance(record, dict) or field not in record:
        raise SpecError("task.text_field", f"{file}: line {number} has no field {field!r}",
                        list(record) if isinstance(record, dict) else None)
    return record


def dataset_parts(folder: Path, field: str):
    """The Dataset(s) a save_to_disk folder holds (every split of a DatasetDict), checked for `field`."""
    try:
        import datasets
    except ImportError:
        raise WorkbenchError(f"task.path: {folder} is a saved `datasets` dataset; reading it needs "
                             "`pip install 'transformer-workbench[data]'`") from None
    try:
        loaded = datasets.load_from_disk(str(folder))
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds for a damaged folder
        raise SpecError("task.path", f"{folder} is not a readable saved dataset ({type(err).__name__}: "
                                     f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None
    parts = list(loaded.values()) if isinstance(loaded, datasets.DatasetDict) else [loaded]
    for part in parts:
        if field not in part.column_names:
            raise SpecError("task.text_field", f"{folder} has no column {field!r}", part.column_names)
    return parts


def pieces(data: bytes, size: int = PIECE_BYTES) -> Iterator[bytes]:
    """`data` in pieces of about `size` bytes, each cut after a line break where there is one."""
    start = 0
    while start < len(data):
        end = start + size
        if end < len(data):
            cut = data.rfind(b"\n", start, end)
            end = cut + 1 if cut >= start else end
        yield data[start:end]
        start = end


def file_pieces(file: Path, start: int = 0, stop: int | None = None) -> Iterator[bytes]:
    """Bytes [start, stop) of a file, in pieces cut after line breaks."""
    remaining = (file.stat().st_size if stop is None else stop) - start
    with open(file, "rb") as handle:
        handle.seek(start)
        carry = b""
        while remaining > 0 and (block := handle.read(min(PIECE_BYTES, remaining))):
            remaining -= len(block)
            block = carry + block
            cut = (block.rfind(b"\n") + 1 or len(block)) if remaining > 0 else len(block)
            yield block[:cut]
            carry = block[cut:]
        if carry:
            yield carry


def record_texts(file: Path, field: str, wanted: set[int]) -> Iterator[tuple[int, bytes]]:
    """(index, UTF-8 text) of the records of `file` whose index is in `wanted`, in file order."""
    if file.suffix == ".parquet":
        index = 0
        for batch in parquet_file(file).iter_batches(columns=[field], batch_size=1024):
            for text in batch.column(0).to_pylist():
                if index in wanted:
                    yield index, str(text or "").encode()
                index += 1
    elif is_datasets_folder(file):
        index = 0
        for part in dataset_parts(file, field):
            for row in part.select_columns([field]).iter(batch_size=1024):
                for text in row[field]:
                    if index in wanted:
                        yield index, str(text or "").encode()
                    index += 1
    else:
        with open(file, "rb") as lines:
            records = ((number, line) for number, line in enumerate(lines, 1) if line.strip())
            for index, (number, line) in enumerate(records):
                if index in wanted:
                    yield index, str(json_record(line, file, number, field)[field] or "").encode()


def document_texts(documents: list[Document], field: str) -> Iterator[bytes]:
    """Each document's text in pieces, documents in order (records of one file read in one pass)."""
    by_file: dict[Path, list[Document]] = {}
    for doc in documents:
        by_file.setdefault(doc.file, []).append(doc)
    for file, docs in by_file.items():
        if docs[0].index is None:
            yield from file_pieces(file)
            yield b"\n"  # documents are joined by a line break, as the default corpus is
        else:
            for _, text in record_texts(file, field, {d.index for d in docs}):
                yield from pieces(text)
                yield b"\n"
