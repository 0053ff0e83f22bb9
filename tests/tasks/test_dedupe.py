"""text_lm's `dedupe` (workbench.tasks.corpus): exact and near duplicate documents are removed
before the split by document, the document whose name sorts first kept, and `prepare` says how
many it removed. Every corpus is generated here; shards go to a per-test WORKBENCH_DATA_DIR."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

from datasketch import MinHash

from workbench.cli import main
from workbench.errors import SpecError, WorkbenchError
from workbench.study import task_section
from workbench.tasks import tokens as tokens_module
from workbench.tasks.corpus import MINHASH_SEED, NUM_PERM, Source, find_duplicates, pieces, sketch
from workbench_plugins.task_text_lm import LATER_FIELDS, TextLM, TextParams, source_texts

VOCABULARY = [f"w{i}" for i in range(5000)]  # wide enough that two drawn documents share almost no 5-gram


@pytest.fixture(autouse=True)
def data(tmp_path, monkeypatch):
    monkeypatch.setenv(tokens_module.DATA_DIR_ENV, str(tmp_path / "data"))
    return tmp_path / "data"


def words(seed: int, n: int = 300) -> list[str]:
    rng = np.random.default_rng(seed)
    return [VOCABULARY[i] for i in rng.integers(0, len(VOCABULARY), n)]


def text(ws: list[str]) -> str:
    """Words as lines of 12, as a file of prose lies."""
    return "\n".join(" ".join(ws[i: i + 12]) for i in range(0, len(ws), 12)) + "\n"


def changed(ws: list[str], *at: int) -> list[str]:
    """`ws` with the words at `at` replaced by words no document has."""
    out = list(ws)
    for i in at:
        out[i] = f"changed{i}"
    return out


def folder(root, files: dict[str, str]):
    root.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        (root / name).write_text(body)
    return root


def kept(root, dedupe: str) -> list[str]:
    return [d.name for d in find_duplicates(Source(str(root)).documents(), "text", dedupe).kept]


def task(root, **params) -> TextLM:
    return TextLM(TextParams(**{"path": str(root), "train_length": 16, "n_eval": 4, "decode_samples": 0, **params}),
                  seed=0)


# ---- what counts as a duplicate ----------------------------------------------------------------


def test_exact_duplicates_are_equal_after_nfc_and_whitespace_folding(tmp_path):
    root = folder(tmp_path / "c", {
        "a.txt": "Caf\u00e9 au lait\n\tis  hot\n",  # composed é
        "b.txt": "  Cafe\u0301 au lait is hot",  # decomposed é, other whitespace: the same text
        "c.txt": "Caf\u00e9 au lait is cold",
        "d.txt": "caf\u00e9 au lait is hot",  # case is text: not an exact copy
    })
    assert kept(root, "exact") == ["a.txt", "c.txt", "d.txt"]
    found = find_duplicates(Source(str(root)).documents(), "text", "none")
    assert [d.name for d in found.kept] == ["a.txt", "b.txt", "c.txt", "d.txt"]  # none keeps them, and counts
    assert found.record() == {"dedupe": "none", "documents": 4, "exact": 1, "near": 0}


def test_one_word_changed_in_300_is_a_near_duplicate_and_unrelated_documents_stay(tmp_path):
    base = words(0)
    half = base[:150] + words(2, 150)  # shares half its text: a Jaccard of about 1/3, not a copy
    root = folder(tmp_path / "c", {"a.txt": text(base), "b.txt": text(changed(base, 150)), "c.txt": text(words(1)),
                                   "d.txt": text(half)})
    assert kept(root, "near") == ["a.txt", "c.txt", "d.txt"]
    assert kept(root, "exact") == ["a.txt", "b.txt", "c.txt", "d.txt"]
    found = find_duplicates(Source(str(root)).documents(), "text", "near")
    assert found.record() == {"dedupe": "near", "documents": 4, "exact": 0, "near": 1}


def test_a_candidate_below_the_threshold_is_kept(tmp_path):
    """12 of 300 words changed (Jaccard about 0.66): LSH proposes many such pairs, the estimated
    Jaccard turns them down."""
    files = {}
    for k in range(12):
        base = words(50 + k)
        files[f"p{k:02d}a.txt"], files[f"p{k:02d}b.txt"] = text(base), text(changed(base, *range(10, 300, 25)))
    root = folder(tmp_path / "c", files)
    assert kept(root, "near") == sorted(files)


def test_a_document_under_five_words_is_compared_exactly_only(tmp_path):
    root = folder(tmp_path / "c", {"a.txt": "one two three four", "b.txt": "one two three five",
                                   "c.txt": "one  two three\nfour", "d.txt": text(words(3))})
    assert kept(root, "near") == ["a.txt", "b.txt", "d.txt"]


def test_the_kept_document_is_the_first_by_name_whatever_the_listing_order(tmp_path):
    base = words(4)
    root = folder(tmp_path / "c", {"z.txt": text(base), "m.txt": text(changed(base, 10)),
                                   "a.txt": "  " + " ".join(base), "k.txt": text(words(5))})
    documents = Source(str(root)).documents()
    for listed in (documents, documents[::-1], documents[1::2] + documents[::2]):
        found = find_duplicates(listed, "text", "near")
        assert sorted(d.name for d in found.kept) == ["a.txt", "k.txt"]
        assert (found.exact, found.near) == (1, 1)  # z is a's exact copy, m a near one


def test_a_fixed_seed_keeps_the_same_documents_every_time(tmp_path):
    """Pairs around the threshold (5 to 8 of 300 words changed: Jaccard about 0.84 to 0.76) are
    decided by the signatures' estimate: the same every time, from the same permutations."""
    files = {}
    for k in range(16):
        base = words(100 + k)
        files[f"p{k:02d}a.txt"] = text(base)
        files[f"p{k:02d}b.txt"] = text(changed(base, *range(7, 300, 300 // (5 + k % 4))))
    root = folder(tmp_path / "c", files)
    first, second = kept(root, "near"), kept(root, "near")
    assert first == second
    assert 16 < len(first) < 32  # some of the pairs kept whole, some not: the estimate decided
    one, other = (sketch(pieces(text(words(7)).encode(), 64), MinHash(num_perm=NUM_PERM, seed=MINHASH_SEED))[1]
                  for _ in range(2))
    assert np.array_equal(one.hashvalues, other.hashvalues)


def test_a_document_read_in_pieces_cut_anywhere_signs_as_one_read_whole():
    body = "Za\u0308hlen  und Wo\u0308rter\n" * 40 + text(words(8))
    whole = body.encode()
    base = MinHash(num_perm=NUM_PERM, seed=MINHASH_SEED)
    at_once = sketch([whole], base)
    for size in (1, 3, 7, 64):  # mid-word, mid-character, mid-combining sequence
        cut = [whole[i: i + size] for i in range(0, len(whole), size)]
        digest, signature = sketch(cut, base)
        assert digest == at_once[0] and np.array_equal(signature.hashvalues, at_once[1].hashvalues)


# ---- the split ---------------------------------------------------------------------------------


def grouped_corpus(root, groups: int = 30):
    """`groups` documents, each with an exact copy (other whitespace) and a near copy (one word
    changed), under names that interleave the groups."""
    files = {}
    for g in range(groups):
        base = words(200 + g)
        files[f"{g:02d}-orig.txt"] = text(base)
        files[f"x{g:02d}-copy.txt"] = "\n\n" + "  ".join(base)
        files[f"m{g:02d}-near.txt"] = text(changed(base, 100))
    return folder(root, files)


def group(name: str) -> int:
    return int(name.lstrip("xm")[:2])


def test_no_document_sits_on_both_sides_of_the_split(tmp_path):
    root = grouped_corpus(tmp_path / "c")
    train, valid = Source(str(root), dedupe="near").split(0.3)
    assert sorted(group(d.name) for d in train + valid) == list(range(30))  # one document of each group
    assert {d.name for d in train + valid} == {f"{g:02d}-orig.txt" for g in range(30)}  # the first by name
    assert not {group(d.name) for d in train} & {group(d.name) for d in valid}
    train, valid = Source(str(root)).split(0.3)  # without dedupe the copies straddle the split
    assert {group(d.name) for d in train} & {group(d.name) for d in valid}


def test_records_are_deduplicated_per_record(tmp_path):
    bodies = [text(words(300 + i)) for i in range(6)]
    records = bodies + [bodies[0], " ".join(bodies[1].split()), text(changed(bodies[2].split(), 50))]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": b}) + "\n" for b in records))
    found = find_duplicates(Source(str(path)).documents(), "text", "near")
    assert [d.name for d in found.kept] == [f"docs.jsonl#{i}" for i in range(6)]
    assert (found.documents, found.exact, found.near) == (9, 2, 1)


def test_a_single_file_is_one_document_and_is_not_deduplicated(tmp_path):
    (tmp_path / "one.txt").write_text(text(words(9)) * 4)  # repeats inside one document stay
    assert Source(str(tmp_path / "one.txt"), dedupe="near").split(0.1) is None
    message = task(tmp_path / "one.txt", dedupe="near").prepare()
    assert message.startswith("text_lm: one document (a single file, cut by position: nothing to deduplicate); ")


def test_a_corpus_of_copies_leaves_too_few_documents_to_split(tmp_path):
    root = folder(tmp_path / "c", {"a.txt": text(words(10)), "b.txt": text(words(10))})
    with pytest.raises(WorkbenchError, match="holds 1 document\\(s\\) once 1 duplicate\\(s\\) are removed"):
        Source(str(root), dedupe="exact").split(0.1)


def test_planning_bounds_each_split_by_the_whole_corpus_without_reading_it(tmp_path, monkeypatch):
    root = grouped_corpus(tmp_path / "c", groups=3)
    total = sum(p.stat().st_size for p in root.iterdir())
    monkeypatch.setattr("workbench.tasks.corpus.find_duplicates", lambda *a: pytest.fail("planning read the texts"))
    assert Source(str(root), dedupe="near").split_bytes(0.1) == (total, total)
    assert sum(Source(str(root)).split_bytes(0.1)) == total


# ---- shard keys, meta.json and the message ---------------------------------------------------


def test_the_shard_key_changes_with_dedupe_and_stays_as_it_was_without(tmp_path):
    root = grouped_corpus(tmp_path / "c", groups=3)
    keys = {mode: source_texts(Source(str(root), dedupe=mode), 0.1).fingerprint for mode in ("none", "exact", "near")}
    assert len(set(keys.values())) == 3
    before = hashlib.blake2b(f"{Source(str(root)).fingerprint()}|0.1".encode(), digest_size=16).hexdigest()
    assert keys["none"] == before  # folders prepared before dedupe existed are found under their names
    assert task(root).shards().folder != task(root, dedupe="near").shards().folder


def test_prepare_names_the_counts_and_says_them_again_from_meta_json(tmp_path, data):
    root = grouped_corpus(tmp_path / "c", groups=5)
    near = task(root, dedupe="near")
    said = near.prepare()
    assert said.startswith("text_lm: 15 documents, 5 exact and 5 near duplicates removed before the split; "), said
    assert " training and " in said and "\n" not in said
    folder_ = near.shards().folder
    assert json.loads((folder_ / "meta.json").read_text())["duplicates"] == {"dedupe": "near", "documents": 15,
                                                                              "exact": 5, "near": 5}
    assert task(root, dedupe="near").prepare() == said  # the folder exists: the counts come from meta.json
    assert task(root, dedupe="exact").prepare().startswith(
        "text_lm: 15 documents, 5 exact duplicates removed before the split; ")
    assert task(root).prepare().startswith(
        "text_lm: 15 documents, 5 exact duplicate documents kept; task.dedupe: exact or near removes them; ")


def test_prepare_from_the_command_line_is_one_line(tmp_path):
    root = grouped_corpus(tmp_path / "c", groups=4)
    (tmp_path / "study.yaml").write_text(
        f"name: d\ntask: {{name: text_lm, path: {root}, train_length: 16, n_eval: 4, decode_samples: 0, "
        "dedupe: near}\nmodel: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}\ntrain: {steps: 2, "
        "batch_size: 2}\n")
    result = CliRunner().invoke(main, ["prepare", str(tmp_path / "study.yaml")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("text_lm: 12 documents, 4 exact and 4 near duplicates removed before the split; ")
    assert len(result.output.splitlines()) == 1


def test_a_folder_prepared_before_dedupe_is_still_read_and_a_tampered_count_is_one_line(tmp_path):
    root = grouped_corpus(tmp_path / "c", groups=3)
    folder_ = task(root).shards().folder
    meta = json.loads((folder_ / "meta.json").read_text())
    (folder_ / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "duplicates"}))
    assert task(root).prepare().startswith(f"text_lm: {meta['splits']['train']['tokens']:,} training and ")
    (folder_ / "meta.json").write_text(json.dumps({**meta, "duplicates": {**meta["duplicates"], "exact": 9}}))
    with pytest.raises(WorkbenchError, match="not a shard folder the workbench wrote .*duplicates"):
        task(root).shards()


# ---- the option ----------------------------------------------------------------------------------


def test_dedupe_at_its_default_keeps_every_run_id_and_needs_a_path():
    assert "dedupe" in LATER_FIELDS
    assert "dedupe" not in TextParams(path="corpus").model_dump()
    assert TextParams(path="corpus", dedupe="near").model_dump()["dedupe"] == "near"
    with pytest.raises(SpecError, match="task.dedupe: exact removes duplicate documents of a corpus named by task.path"):
        task_section({"name": "text_lm", "dedupe": "exact"})
    with pytest.raises(SpecError, match="task.dedupe"):
        task_section({"name": "text_lm", "path": "corpus", "dedupe": "fuzzy"})
