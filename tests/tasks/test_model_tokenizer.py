"""A text task's tokenizer in the model's ids (workbench.tasks.model_tokenizer): every id is the
tokenizer's id + 4, the special tokens take 0..3, and transformers reads it back the same."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from workbench.tasks import SPECIALS
from workbench.tasks.model_tokenizer import byte_symbols, model_tokenizer, transformers_tokenizer
from workbench.tasks.tokens import ByteTokenizer, HFTokenizer, train_bpe

TEXT = "def f(x):\n\treturn  x ** 2  # é, ü, 猫 and a tab\t!"
CORPUS = Path(argparse.__file__).read_bytes()[:30_000]


def test_bytes_are_their_value_plus_four_and_every_byte_decodes():
    assert set(byte_symbols()) == set(pre_tokenizers.ByteLevel.alphabet())  # GPT-2's 256 symbols, each once
    tok = model_tokenizer(ByteTokenizer())
    assert [tok.id_to_token(i) for i in range(4)] == list(SPECIALS)
    assert tok.encode(TEXT).ids == [b + 4 for b in TEXT.encode()]
    assert tok.decode(tok.encode(TEXT).ids) == TEXT
    everything = list(range(256))  # not UTF-8: decoded with replacement characters, as ByteTokenizer does
    assert tok.decode([b + 4 for b in everything]) == ByteTokenizer().decode(everything)


def test_a_trained_bpe_moves_past_the_specials():
    bpe = train_bpe(iter([CORPUS]), 400)
    tok = model_tokenizer(bpe)
    assert tok.encode(TEXT).ids == [i + 4 for i in bpe.tokenizer.encode(TEXT, add_special_tokens=False).ids]
    assert tok.get_vocab_size() == bpe.vocab_size + 4
    assert tok.encode("x <eos>").ids[-1] == SPECIALS.index("<eos>")  # a special written in a prompt is that token
    assert tok.decode([1, *tok.encode("return x").ids, 2]) == "return x"  # specials left out


def test_a_special_the_vocabulary_already_holds_gets_another_name():
    base = Tokenizer(models.WordLevel({"[UNK]": 0, "<pad>": 1, "a": 2, "b": 3}, unk_token="[UNK]"))
    base.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # a named tokenizer.json with a "<pad>" word of its own
    tok = model_tokenizer(HFTokenizer(base))
    assert [tok.id_to_token(i) for i in range(4)] == ["<<pad>>", "<bos>", "<eos>", "<sep>"]
    assert tok.encode("a <pad> b").ids == [6, 5, 7]


def test_a_named_tokenizer_keeps_its_own_specials_and_adds_nothing_around_a_prompt():
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    base.train_from_iterator([CORPUS.decode()], trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                                    show_progress=False))
    end = base.token_to_id("<|endoftext|>")
    base.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A",
                                                        special_tokens=[("<|endoftext|>", end)])
    tok = model_tokenizer(HFTokenizer(base))
    assert tok.token_to_id("<|endoftext|>") == end + 4
    assert tok.encode(TEXT).ids == [i + 4 for i in base.encode(TEXT, add_special_tokens=False).ids]


def test_a_unigram_tokenizer_moves_past_the_specials_too():
    base = Tokenizer(models.Unigram())
    base.train_from_iterator([CORPUS.decode()], trainers.UnigramTrainer(vocab_size=200, unk_token="<unk>",
                                                                        special_tokens=["<unk>"], show_progress=False))
    tok = model_tokenizer(HFTokenizer(base))
    assert tok.encode(TEXT).ids == [i + 4 for i in base.encode(TEXT, add_special_tokens=False).ids]
    assert tok.token_to_id("<unk>") == base.token_to_id("<unk>") + 4


def test_transformers_reads_the_saved_tokenizer_with_its_roles(tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = model_tokenizer(train_bpe(iter([CORPUS]), 400))
    transformers_tokenizer(tok).save_pretrained(tmp_path)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    roles = (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id, loaded.sep_token_id)
    assert roles == tuple(SPECIALS.index(s) for s in ("<pad>", "<bos>", "<eos>", "<sep>"))
    assert loaded(TEXT).input_ids == tok.encode(TEXT).ids  # nothing added around the text
    assert loaded.decode(tok.encode(TEXT + " .").ids, skip_special_tokens=True) == TEXT + " ."  # no space clean-up
