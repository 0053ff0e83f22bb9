"""A task's tokenizer in the model's ids: what `workbench generate` encodes prompts with and
decodes continuations with, and what `workbench export --to hf` writes as tokenizer.json, so
that `transformers.AutoTokenizer` reads and writes the ids the exported model was trained on.

A symbol task's (copy, reverse, passkey, ...) is its vocabulary as a word-level tokenizer
(`word_level`): its words apart by whitespace, as `Task.text_words` reads them, so a reversal
decoder is prompted with `<bos> a b c <sep>` and answers `c b a <eos>`. A text task's
(text_lm) is its `tokenizers` file in model ids, as follows.

A model's vocabulary is the four special tokens (`SPECIALS`: <pad> 0, <bos> 1, <eos> 2, <sep> 3)
followed by the tokenizer's ids: model id = tokenizer id + 4 (`Task._set_vocab`). The
tokenizer in model ids is the task's HuggingFace `tokenizers` file with its model's vocabulary
shifted by 4 and the specials at ids 0..3, as special tokens (skipped by
`decode(..., skip_special_tokens=True)`). Two consequences, both transformers' conventions:
a special token written literally in a prompt ("<eos>") is read as that token, and nothing is
added around a prompt (no <bos>: the text task trains on windows of plain text).

The byte tokenizer (ids = byte values) becomes a byte-level BPE without merges over GPT-2's 256
byte symbols (`byte_symbols`), so that any text encodes and every byte sequence decodes (bytes
that are not UTF-8 as U+FFFD, as `ByteTokenizer.decode`). A trained BPE and a named
tokenizer.json keep their normalizer, pre-tokenizer, model and decoder; their post-processor
is dropped unless it is ByteLevel (one that adds tokens, as BERT's [CLS] ... [SEP], would add
what the task never trained on), as are padding and truncation settings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from workbench.errors import SpecError
from workbench.model.hf_architecture import import_transformers
from workbench.tasks.tokens import SPECIALS, ByteTokenizer, HFTokenizer

ROLES = ("pad_token", "bos_token", "eos_token", "sep_token")  # transformers' names of SPECIALS, in order


def word_level(vocab: Sequence[str]):
    """A symbol task's vocabulary (SPECIALS first, at ids 0..3) as a `tokenizers.Tokenizer`: each
    whitespace-separated word is the token of that name, the specials are special tokens (also
    matched without spaces around them, and skipped by `decode(..., skip_special_tokens=True)`),
    and decoding joins the words with spaces. A word outside the vocabulary cannot be encoded
    (there is no unknown token: the task never trained one)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    spaced = next((word for word in vocab if not word or any(c.isspace() for c in word)), None)
    if spaced is not None:
        raise SpecError("task", f"its vocabulary word {spaced!r} is empty or holds whitespace, so a prompt "
                        "of words apart by whitespace cannot name it")
    tokenizer = Tokenizer(models.WordLevel(vocab={word: i for i, word in enumerate(vocab)}))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in vocab[:len(SPECIALS)]])
    return tokenizer


def byte_symbols() -> list[str]:
    """The printable character standing for each byte value (GPT-2's `bytes_to_unicode`,
    openai/gpt-2 src/encoder.py): printable Latin-1 stands for itself, the others from U+0100 on."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in kept}
    for shift, b in enumerate(b for b in range(256) if b not in symbols):
        symbols[b] = chr(256 + shift)
    return [symbols[b] for b in range(256)]


def byte_level_json() -> dict:
    """The byte tokenizer as a `tokenizers` file: byte b is token b, no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab={s: b for b, s in enumerate(byte_symbols())}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return json.loads(tokenizer.to_str())


def special_names(taken) -> list[str]:
    """SPECIALS, each bracketed once more while the tokenizer already has a token of that name."""
    names = []
    for name in SPECIALS:
        while name in taken:
            name = f"<{name}>"
        names.append(name)
    return names


def shifted(content: dict) -> dict:
    """A `tokenizers` file's content with its vocabulary moved past SPECIALS, which take ids 0..3."""
    model = dict(content["model"])
    vocab, added = model["vocab"], content.get("added_tokens") or []
    n = len(SPECIALS)
    pieces = vocab if isinstance(vocab, dict) else [piece for piece, _ in vocab]
    names = special_names({*pieces, *(token["content"] for token in added)})
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        model["vocab"] = {**{name: i for i, name in enumerate(names)}, **{t: i + n for t, i in vocab.items()}}
    else:  # Unigram: [token, score] by id; the specials are only ever matched as added tokens
        model["vocab"] = [[name, 0.0] for name in names] + vocab
        if model.get("unk_id") is not None:
            model["unk_id"] += n
    specials = [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True} for i, name in enumerate(names)]
    theirs = [{**token, "id": token["id"] + n} for token in added]
    processor = content.get("post_processor")
    keep = processor is not None and processor.get("type") == "ByteLevel"
    return {**content, "model": model, "added_tokens": specials + theirs, "truncation": None, "padding": None,
            "post_processor": processor if keep else None}


def model_tokenizer(tokenizer: ByteTokenizer | HFTokenizer):
    """The `tokenizers.Tokenizer` in model ids of a text task's tokenizer (module docstring)."""
    from tokenizers import Tokenizer

    original = byte_level_json() if isinstance(tokenizer, ByteTokenizer) else json.loads(tokenizer.tokenizer.to_str())
    out = Tokenizer.from_str(json.dumps(shifted(original)))
    for token in original.get("added_tokens") or []:  # their own specials (e.g. <|endoftext|>) moved with the rest
        if out.token_to_id(token["content"]) != token["id"] + len(SPECIALS):
            raise SpecError("task.tokenizer", f"its added token {token['content']!r} (id {token['id']}) does not "
                            "follow its vocabulary: the tokenizer cannot be moved past the special tokens")
    return out


def transformers_tokenizer(tokenizer):
    """A tokenizer in model ids (`model_tokenizer`) as transformers' fast tokenizer, with its
    special tokens in their roles (`save_pretrained` writes tokenizer.json and its config)."""
    transformers = import_transformers()
    roles = {role: tokenizer.id_to_token(i) for i, role in enumerate(ROLES)}
    # no clean-up of spaces before punctuation: decoding gives back exactly the text's bytes
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, clean_up_tokenization_spaces=False,
                                                **roles)
