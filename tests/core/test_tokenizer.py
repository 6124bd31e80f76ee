"""Prompts become token IDs: the built-in byte-level tokenizer, and a real BPE
tokenizer.json (trained here with `tokenizers`' own trainer on a corpus the test makes)."""

from __future__ import annotations

import pytest

from inference_lab.common.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    TokenizerError,
    ids_to_bytes,
    load_tokenizer,
)


def test_the_builtin_tokenizer_reads_four_utf8_bytes_per_token():
    tok = ByteTokenizer()
    assert list(tok.encode("abcd")) == [int.from_bytes(b"abcd", "little")]
    assert list(tok.encode("abcde")) == [int.from_bytes(b"abcd", "little"), ord("e")]
    assert len(tok.encode("é" * 3)) == 2  # 6 bytes
    assert tok.count("é" * 3) == 2 and tok.count("") == 0


def test_builtin_chat_headers_never_collide_with_text_and_prefixes_are_shared():
    tok = ByteTokenizer()
    a = tok.encode_chat([("system", "be brief"), ("user", "hi")])
    b = tok.encode_chat([("system", "be brief"), ("user", "bye")])
    assert len(a) == 3 + 2 + 3 + 1 + 3
    assert a[:8] == b[:8] and a[8] != b[8]
    headers = [a[0], a[1], a[2]]
    assert all(h.to_bytes(4, "little").count(0xFF) for h in headers)  # 0xFF is never UTF-8


def test_ids_pack_as_little_endian_uint32():
    assert ids_to_bytes([1, 2**32 - 1]) == b"\x01\0\0\0\xff\xff\xff\xff"
    assert ids_to_bytes(ByteTokenizer().encode("abcd")) == b"abcd"


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = ["the cache holds the prefix of the prompt", "a router reads the cache events",
              "prefix caching saves the prefill of shared prompts"] * 50
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_a_trained_bpe_tokenizer_json_counts_its_own_tokens(bpe_file):
    tok = load_tokenizer(str(bpe_file))
    assert isinstance(tok, HFTokenizer)
    ids = tok.encode("the prefix cache")
    assert len(ids) == 3  # whole words of the corpus are merged into one token each
    chat = tok.encode_chat([("user", "the prefix cache")])
    assert len(chat) > len(ids) and tok.count("the prefix cache") == 3


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("{not json", "is not a Hugging Face tokenizer.json"),
    ('{"version": "1.0"}', "is not a Hugging Face tokenizer.json"),
])
def test_an_unusable_tokenizer_file_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "tokenizer.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TokenizerError, match=message):
        load_tokenizer(str(path))


def test_builtin_pieces_are_the_decoded_text_each_token_and_its_offset():
    tok = ByteTokenizer()
    assert tok.pieces(tok.encode("Sky: blue")) == ("Sky: blue", ["Sky:", " blu", "e"], [0, 4, 8])
    # "é€": 2 + 3 bytes; "€" starts in the first token and completes in the second
    text, tokens, offsets = tok.pieces(tok.encode("aé€b"))
    assert text == "aé€b" and offsets == [0, 2] and tokens == ["aé\ufffd", "\ufffd\ufffdb"]
    header = tok.encode_chat([("user", "hi")])
    text, tokens, offsets = tok.pieces(header)
    assert tokens[:3] == ["<|start|>", "<|user|>", "<|message|>"] and text == tok.decode(header)
    assert offsets[:4] == [0, 9, 17, 28]


def test_a_tokenizer_json_gives_its_own_offsets_for_its_pieces(bpe_file):
    tok = load_tokenizer(str(bpe_file))
    text, tokens, offsets = tok.pieces(tok.encode("the prefix cache"))
    assert tokens == ["the", "prefix", "cache"] and offsets == [0, 4, 11]
    assert text == "the prefix cache"
