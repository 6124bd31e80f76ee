"""Prompts as token IDs: the built-in byte-level tokenizer, or a Hugging Face tokenizer.json.

Knows how text and chat messages become a sequence of token IDs (each below 2^32), and
the one wire form they travel in: packed little-endian uint32 (`ids_to_bytes`). Does not
know HTTP, gRPC or the engine.

The built-in tokenizer (the default) is deterministic across runs, processes and
machines: a UTF-8 string is cut into 4-byte pieces (the last one padded with zero bytes)
and each piece, read as a little-endian uint32, is one token ID. So a text of b bytes has
ceil(b / 4) tokens, and two prompts share a token prefix exactly when their texts share a
byte prefix cut on a 4-byte boundary. A chat is rendered as, per message, three header
tokens (`<|start|>`, the role, `<|message|>`) and the content's tokens, then the three
header tokens of the assistant's reply; header IDs contain the byte 0xFF, which UTF-8
never produces, so they never collide with text.

`--tokenizer PATH` loads a Hugging Face `tokenizer.json` with the `tokenizers` package
(nothing is downloaded); a chat is then rendered as the text
`<|role|>\\ncontent\\n` per message followed by `<|assistant|>\\n`, and encoded whole.
"""

from __future__ import annotations

import codecs
import os
import zlib
from array import array
from collections.abc import Iterable, Sequence

from inference_lab.common.extras import require

__all__ = ["ByteTokenizer", "HFTokenizer", "JoinedIds", "Tokenizer", "TokenizerError",
           "ids_to_bytes", "load_tokenizer"]

Messages = Iterable[tuple[str, str]]  # (role, content text)

# Header token IDs of the built-in tokenizer: each holds a 0xFF byte (never valid UTF-8).
START = 0xFFFFFF01
MESSAGE = 0xFFFFFF02
_ROLES = {"system": 0xFFFFFF10, "user": 0xFFFFFF11, "assistant": 0xFFFFFF12,
          "tool": 0xFFFFFF13, "developer": 0xFFFFFF14, "function": 0xFFFFFF15}
_NAMES = {START: "<|start|>", MESSAGE: "<|message|>",
          **{rid: f"<|{role}|>" for role, rid in _ROLES.items()}}


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used (missing, unreadable or not a tokenizer)."""


class JoinedIds(Sequence[int]):
    """Token ID sequences read as one, without copying them into one: a cross-encoder's
    (query, separator, document) pair shares its query's IDs with every other pair, so
    a request of one query and N documents holds the query once. Its packed form
    (`ids_to_bytes`) is made when asked for, one pair at a time."""

    __slots__ = ("parts", "_len")

    def __init__(self, *parts: Sequence[int]) -> None:
        self.parts = tuple(p if isinstance(p, array) and p.typecode == "I" else array("I", p)
                           for p in parts if len(p))
        self._len = sum(len(p) for p in self.parts)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step == 1 and start <= stop:  # (truncation keeps a tail: no part is copied whole)
                kept, at = [], 0
                for part in self.parts:
                    lo, hi = max(start - at, 0), min(stop - at, len(part))
                    if lo < hi:
                        kept.append(part if (lo, hi) == (0, len(part)) else part[lo:hi])
                    at += len(part)
                return JoinedIds(*kept)
            return array("I", self.tobytes())[index]
        if index < 0:
            index += self._len
        for part in self.parts:
            if 0 <= index < len(part):
                return part[index]
            index -= len(part)
        raise IndexError("JoinedIds index out of range")

    def __iter__(self):
        for part in self.parts:
            yield from part

    def tobytes(self) -> bytes:
        return b"".join(ids_to_bytes(p) for p in self.parts)


def ids_to_bytes(ids: Sequence[int]) -> bytes:
    """Token IDs as packed little-endian uint32, the form the engine's API takes."""
    if isinstance(ids, JoinedIds):
        return ids.tobytes()
    if isinstance(ids, array) and ids.typecode == "I" and ids.itemsize == 4:
        return ids.tobytes()
    return array("I", ids).tobytes()


def _role_id(role: str) -> int:
    rid = _ROLES.get(role)
    return rid if rid is not None else 0xFFFF0000 | (zlib.crc32(role.encode()) & 0xFFFF)


class ByteTokenizer:
    """Four UTF-8 bytes per token; see the module docstring."""

    name = "builtin-bytes"

    def encode(self, text: str) -> array:
        data = text.encode("utf-8")
        pad = -len(data) % 4
        if pad:
            data += b"\0" * pad
        ids = array("I")
        ids.frombytes(data)
        return ids

    def count(self, text: str) -> int:
        n = len(text) if text.isascii() else len(text.encode("utf-8"))
        return (n + 3) // 4

    def encode_chat(self, messages: Messages) -> array:
        ids = array("I")
        for role, content in messages:
            ids.extend((START, _role_id(role), MESSAGE))
            if content:
                ids.extend(self.encode(content))
        ids.extend((START, _ROLES["assistant"], MESSAGE))
        return ids

    def token_str(self, token_id: int) -> str:
        """One token as text: its (up to) four bytes without the padding zeros, or a
        header token's name (`<|start|>`, `<|user|>`, `<|message|>`, ...)."""
        if token_id in _NAMES:
            return _NAMES[token_id]
        if token_id >> 16 == 0xFFFF:
            return "<|role|>"  # a role outside the table
        return token_id.to_bytes(4, "little").rstrip(b"\0").decode("utf-8", "replace")

    def pieces(self, ids: Iterable[int]) -> tuple[str, list[str], list[int]]:
        """`decode(ids)`, each token as `token_str` renders it, and the character offset
        in that text where each token starts: the characters complete before its bytes
        (a character cut across tokens is at the offset of the token that completes it).
        An echoed prompt's logprobs."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        out: list[str] = []
        tokens: list[str] = []
        offsets: list[int] = []
        length = 0
        for token_id in ids:
            if token_id in _NAMES or token_id >> 16 == 0xFFFF:
                piece = decoder.decode(b"", final=True)  # a partial character ends here
                decoder.reset()
                out.append(piece)
                length += len(piece)
                offsets.append(length)
                piece = self.token_str(token_id)
            else:
                offsets.append(length)
                piece = decoder.decode(token_id.to_bytes(4, "little").rstrip(b"\0"))
            out.append(piece)
            length += len(piece)
            tokens.append(self.token_str(token_id))
        out.append(decoder.decode(b"", final=True))
        return "".join(out), tokens, offsets

    def decode(self, ids: Iterable[int]) -> str:
        """Text from token IDs (the inverse of `encode` for text without NUL bytes;
        header tokens by name; undecodable bytes as U+FFFD)."""
        out, text = [], bytearray()
        for token_id in ids:
            if token_id in _NAMES or token_id >> 16 == 0xFFFF:
                out.append(text.decode("utf-8", "replace"))
                text.clear()
                out.append(self.token_str(token_id))
            else:
                text += token_id.to_bytes(4, "little").rstrip(b"\0")
        out.append(text.decode("utf-8", "replace"))
        return "".join(out)


class HFTokenizer:
    """A Hugging Face `tokenizer.json`, through the `tokenizers` package."""

    def __init__(self, path: str) -> None:
        _Tokenizer = require("tokenizers", "--tokenizer needs", "tokenizer").Tokenizer
        if not os.path.isfile(path):
            raise TokenizerError(f"tokenizer file {path} does not exist (or is not a file)")
        self.path = str(path)  # (a process started with the same flags loads it again)
        try:
            self._tok = _Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a plain Exception for bad JSON
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TokenizerError(f"tokenizer file {path} is not a Hugging Face "
                                 f"tokenizer.json: {first}") from None
        self.name = str(path)

    def encode(self, text: str) -> array:
        return array("I", self._tok.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def token_str(self, token_id: int) -> str:
        return self._tok.id_to_token(token_id) or ""

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def pieces(self, ids: Iterable[int]) -> tuple[str, list[str], list[int]]:
        """`decode(ids)`, each token as `token_str` renders it, and the character offset
        in that text where each token starts (the tokenizer's own offsets when the text
        encodes back to the same ids, else each token's decoded length added up, within
        the text)."""
        ids = list(ids)
        text = self.decode(ids)
        encoding = self._tok.encode(text, add_special_tokens=False)
        if encoding.ids == ids:
            offsets = [start for start, _ in encoding.offsets]
        else:
            offsets, length = [], 0
            for token_id in ids:
                offsets.append(min(length, len(text)))
                length += len(self._tok.decode([token_id], skip_special_tokens=False))
        return text, [self.token_str(i) for i in ids], offsets

    def encode_chat(self, messages: Messages) -> array:
        rendered = "".join(f"<|{role}|>\n{content or ''}\n" for role, content in messages)
        return self.encode(rendered + "<|assistant|>\n")


Tokenizer = ByteTokenizer | HFTokenizer


def load_tokenizer(path: str | None) -> Tokenizer:
    """The built-in tokenizer, or the tokenizer.json at `path`. Raises TokenizerError."""
    return ByteTokenizer() if not path else HFTokenizer(path)
