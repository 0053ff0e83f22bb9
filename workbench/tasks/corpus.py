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

Duplicates (`dedupe`) are removed from the document list before that draw, so a copy can
never sit on both sides of the split (a corpus of one plain text file is one document: nothing
to deduplicate):

    none    nothing is removed (what every corpus had before `dedupe`)
    exact   documents whose text is equal after Unicode NFC and whitespace folding (runs of
            whitespace as one space, none at either end) are kept once
    near    exact, then near copies: MinHash (Broder 1997) with LSH over the set of a document's
            word 5-grams (its NFC words lower-cased), a candidate pair confirmed when the two
            signatures' estimated Jaccard similarity is at least 0.8. The setting follows Lee
            et al. (2022, "Deduplicating Training Data Makes Language Models Better", section
            4.2), who shingle into word 5-grams with a threshold of 0.8; they sign with 9,000
            hash values in 450 bands of 20 and confirm a candidate pair by its edit similarity
            (> 0.8). Here: 128 values, LSH in 18 bands of 7 (LSH_BANDS: as theirs, nearly every
            pair at 0.8 is a candidate), and the pair confirmed by the estimated Jaccard
            (MinHash.jaccard), which needs neither text read again. A document of fewer than 5
            words has no 5-gram: it is compared exactly only.

A duplicate is removed in favour of the document whose name sorts first (a record's name is
its file's with `#<index>`), so the kept set does not depend on the order files are listed
in. Documents are taken in that order, and one is a near copy when it is close to one already
kept (in a chain A ~ B ~ C where A and C are not close, A and C are kept). The MinHash
permutations come from a fixed seed, so a corpus always keeps the same documents (with the
same datasketch: its 2.0 changed the default permutation scheme).

A document is read in pieces of about PIECE_BYTES, cut after a line break, so a corpus of
gigabytes is never held in memory whole; deduplication reads each document once and keeps a
digest per document and a signature of 128 hash values per distinct text.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import itertools
import math
import os
import stat
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.errors import SpecError, WorkbenchError
from workbench.results import file_kind, load_json

if TYPE_CHECKING:
    from datasketch import LeanMinHash, MinHash

PIECE_BYTES = 1 << 20
RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")
DATASETS_MARKERS = ("dataset_info.json", "dataset_dict.json")  # what save_to_disk writes

DEDUPE_MODES = ("none", "exact", "near")  # the text task's `dedupe` (module docstring)
SHINGLE_WORDS = 5  # words per shingle, and the fewest a document needs to be compared as a near copy
NEAR_JACCARD = 0.8  # estimated Jaccard similarity from which a document is a near copy
NUM_PERM = 128
# LSH bands x rows (126 of the 128 values): a pair at Jaccard 0.8 is a candidate with probability
# 1 - (1 - 0.8**7)**18 = 0.986, 0.999 at 0.85, as Lee et al.'s 450 x 20 finds 0.994 at 0.8;
# datasketch's own choice for a threshold of 0.8 (9 x 13) finds 40% at 0.8. The price is
# candidates below the threshold (13% at 0.5), which the confirmation drops.
LSH_BANDS, LSH_ROWS = 18, 7
MINHASH_SEED = 1  # fixed: the same permutations, so the same documents kept, on every run
SHINGLE_BATCH = 8192  # shingles hashed in one update_batch: its (shingles x NUM_PERM) array stays at 4 MB


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
    dedupe: str = "none"  # one of DEDUPE_MODES: which duplicates `split` removes before its draw

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
        """(training, validation) documents, duplicates removed first as `dedupe` says; None for a
        corpus of one plain text file (cut by position: one document, nothing to deduplicate)."""
        return self.split_and_duplicates(valid_fraction)[0]

    def split_and_duplicates(self, valid_fraction: float) -> tuple[tuple[list[Document], list[Document]] | None,
                                                                   Duplicates | None]:
        """`split`, and what `find_duplicates` found (None under dedupe none: then no text is read)."""
        documents = self.documents()
        if len(documents) == 1 and documents[0].index is None:
            return None, None
        found = find_duplicates(documents, self.text_field, self.dedupe) if self.dedupe != "none" else None
        kept = documents if found is None else found.kept
        if len(kept) < 2:
            removed = f" once {len(documents) - len(kept)} duplicate(s) are removed" if found else ""
            raise WorkbenchError(f"task.path: {self.path} holds {len(kept)} document(s){removed}; a split by document "
                                 "needs at least 2")
        return validation_draw(kept, valid_fraction), found

    def split_bytes(self, valid_fraction: float) -> tuple[int, int]:
        """Upper bounds of the (training, validation) text in bytes, from file sizes alone
        (nothing is read): exact for files split by document and for one file cut by position;
        where records are split, or duplicates are removed first (which ones, only their texts
        tell), the files' total bounds each split."""
        files = self.files()
        records = any(is_datasets_folder(f) or f.suffix in RECORD_SUFFIXES for f in files)
        if records or (len(files) > 1 and self.dedupe != "none"):
            total = sum(p.stat().st_size for f in files for p in ([f] if f.is_file() else f.rglob("*")) if p.is_file())
            return total, total
        split = self.split(valid_fraction)  # reads no text: no dedupe, or one file cut by position
        if split is None:
            size = files[0].stat().st_size
            cut = int(size * (1 - valid_fraction))  # as source_texts cuts it
            return cut, size - cut
        return tuple(sum(d.file.stat().st_size for d in docs) for docs in split)


def validation_draw(documents: list[Document], valid_fraction: float) -> tuple[list[Document], list[Document]]:
    """(training, validation): the validation documents are the ceil(valid_fraction * N) whose
    BLAKE2b hash of their name is smallest (at least one document is left to train on)."""
    ranked = sorted(documents, key=lambda d: hashlib.blake2b(d.name.encode(), digest_size=8).digest())
    n_valid = min(len(documents) - 1, math.ceil(valid_fraction * len(documents)))
    valid = set(ranked[:n_valid])
    return [d for d in documents if d not in valid], [d for d in documents if d in valid]


@dataclass(frozen=True)
class Duplicates:
    """What `find_duplicates` found: the documents kept (in the order given) and the counts.
    Under dedupe none every document is kept, and `exact` counts the copies `exact` would remove."""

    dedupe: str
    kept: list[Document]
    documents: int  # documents read
    exact: int  # equal, after NFC and whitespace folding, to a document whose name sorts earlier
    near: int  # further documents that are near copies of a kept one (dedupe near)

    def record(self) -> dict[str, str | int]:
        """The counts, as a shard folder's meta.json keeps them (workbench.tasks.tokens.DuplicateCounts)."""
        return {"dedupe": self.dedupe, "documents": self.documents, "exact": self.exact, "near": self.near}


def find_duplicates(documents: list[Document], field: str, dedupe: str) -> Duplicates:
    """`documents` less their exact (and, for near, near) duplicates, each document read once;
    dedupe none removes nothing but counts the exact copies (module docstring)."""
    from datasketch import MinHash  # here: datasketch imports scipy (0.3 s), paid only where a corpus deduplicates

    base = MinHash(num_perm=NUM_PERM, seed=MINHASH_SEED) if dedupe == "near" else None
    digests: dict[Document, bytes] = {}
    signatures: dict[bytes, LeanMinHash | None] = {}  # one per distinct text: exact copies sign alike
    for doc, texts in each_document(documents, field):
        digests[doc], signature = sketch(texts, base)
        signatures.setdefault(digests[doc], signature)
    first: dict[bytes, Document] = {}  # digest -> the document of that text whose name sorts first
    exact = []
    for doc in sorted(documents, key=lambda d: d.name):
        if digests[doc] in first:
            exact.append(doc)
        else:
            first[digests[doc]] = doc
    near = near_copies([(doc, signatures[digest]) for digest, doc in first.items()]) if dedupe == "near" else []
    removed = set(exact + near) if dedupe != "none" else set()
    return Duplicates(dedupe, [d for d in documents if d not in removed], len(documents), len(exact), len(near))


def folded_words(texts: Iterable[bytes]) -> Iterator[list[str]]:
    """A document's words (its text in Unicode NFC, split at runs of whitespace), a list per piece
    of text; a word cut between two pieces comes whole, with the later one."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may straddle two pieces
    carry = ""
    for piece in texts:
        text = unicodedata.normalize("NFC", carry + decoder.decode(piece))
        words = text.split()
        carry = words.pop() if words and not text[-1].isspace() else ""
        yield words
    yield unicodedata.normalize("NFC", carry + decoder.decode(b"", final=True)).split()


def sketch(texts: Iterable[bytes], base: MinHash | None) -> tuple[bytes, LeanMinHash | None]:
    """A document's digest of its folded text (NFC, each run of whitespace one space) and, given a
    `base` MinHash, the MinHash of its lower-cased word 5-grams (None under 5 words: no 5-gram)."""
    from datasketch import LeanMinHash  # here: as in find_duplicates

    digest = hashlib.blake2b(digest_size=16)
    minhash = None if base is None else base.copy()
    recent: list[str] = []  # the last SHINGLE_WORDS - 1 words: a shingle may span two pieces
    count = 0
    for words in folded_words(texts):
        if not words:
            continue
        joined = " ".join(words)
        digest.update(joined.encode() + b" ")
        count += len(words)
        if minhash is not None:
            lowered = recent + joined.lower().split(" ")
            for batch in shingle_batches(lowered):
                minhash.update_batch(batch)
            recent = lowered[-(SHINGLE_WORDS - 1):]
    return digest.digest(), LeanMinHash(minhash) if minhash is not None and count >= SHINGLE_WORDS else None


def shingle_batches(words: list[str]) -> Iterator[list[bytes]]:
    """The word SHINGLE_WORDS-grams of `words` (UTF-8, words joined by a space), SHINGLE_BATCH at a time."""
    step = SHINGLE_BATCH
    for start in range(0, max(0, len(words) - SHINGLE_WORDS + 1), step):
        window = words[start: start + step + SHINGLE_WORDS - 1]
        grams = map(" ".join, zip(*(window[i:] for i in range(SHINGLE_WORDS))))
        yield "\n".join(grams).encode().split(b"\n")  # one encode for the batch: no word holds a line break


def near_copies(candidates: list[tuple[Document, LeanMinHash | None]]) -> list[Document]:
    """The candidates (in name order) whose estimated Jaccard similarity to one kept before them
    is at least NEAR_JACCARD: LSH proposes, MinHash.jaccard confirms. A document without a
    signature (under 5 words) is kept: it was compared exactly only."""
    from datasketch import MinHashLSH  # here: as in find_duplicates

    lsh = MinHashLSH(num_perm=NUM_PERM, params=(LSH_BANDS, LSH_ROWS))
    kept: list[LeanMinHash] = []
    copies = []
    for doc, signature in candidates:
        if signature is None:
            continue
        if any(kept[key].jaccard(signature) >= NEAR_JACCARD for key in lsh.query(signature)):
            copies.append(doc)
        else:
            lsh.insert(len(kept), signature)
            kept.append(signature)
    return copies


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


def each_document(documents: list[Document], field: str) -> Iterator[tuple[Document, Iterator[bytes]]]:
    """Each document with its text in pieces (read them before the next), documents grouped by
    file (records of one file read in one pass)."""
    by_file: dict[Path, list[Document]] = {}
    for doc in documents:
        by_file.setdefault(doc.file, []).append(doc)
    for file, docs in by_file.items():
        if docs[0].index is None:
            yield docs[0], file_pieces(file)
        else:
            by_index = {d.index: d for d in docs}
            for index, text in record_texts(file, field, set(by_index)):
                yield by_index[index], pieces(text)


def document_texts(documents: list[Document], field: str) -> Iterator[bytes]:
    """Each document's text in pieces, documents in order (records of one file read in one pass)."""
    for _, texts in each_document(documents, field):
        yield from texts
        yield b"\n"  # documents are joined by a line break, as the default corpus is
