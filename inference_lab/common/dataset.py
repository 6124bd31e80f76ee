"""Prompts from a dataset file: inference-lab's `dataset_path`, JSONL in the OpenAI batch
format, one request a line:

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 50}}

`body` holds `messages` (content a string or an array of text parts) or `prompt` (a
string), and optionally `max_tokens` (or `max_completion_tokens`): the cap of that
request's output. Prompts become token IDs with the lab's tokenizer (the built-in one by
default), packed as the engine takes them, so prompts sharing a prefix share blocks in the
prefix cache. Blank lines are skipped; a line is at most inference_lab.common.reading's
MAX_LINE_CHARS, its JSON as deep as Python's parser takes. Does not know the engine or
the clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from inference_lab.common.reading import lines, loads
from inference_lab.common.tokenizer import ByteTokenizer, Tokenizer, ids_to_bytes

__all__ = ["Dataset", "DatasetError"]


class DatasetError(ValueError):
    """A dataset file that cannot be read, or a line that is not a batch request."""


def _text(content: object, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
    raise DatasetError(f"{where}: expected a string or an array of text parts")


def _entry(line: str, where: str, tokenizer: Tokenizer) -> tuple[bytes, int | None]:
    doc = loads(line, where, DatasetError)
    body = doc.get("body") if isinstance(doc, dict) else None
    if not isinstance(body, dict):
        raise DatasetError(f"{where}: body: missing; expected an object (OpenAI batch format)")
    cap = body.get("max_tokens", body.get("max_completion_tokens"))
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise DatasetError(f"{where}: body.max_tokens: expected an integer >= 1, got {cap!r}")
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        pairs = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise DatasetError(f"{where}: body.messages[{i}]: expected an object with a role")
            pairs.append((m["role"], _text(m.get("content"), f"{where}: body.messages[{i}].content")))
        ids = tokenizer.encode_chat(pairs)
    elif isinstance(body.get("prompt"), str):
        ids = tokenizer.encode(body["prompt"])
    else:
        raise DatasetError(f"{where}: body: expected messages (a non-empty array) or prompt (a string)")
    if not ids:
        raise DatasetError(f"{where}: body: the prompt is empty")
    return ids_to_bytes(ids), cap


class Dataset:
    def __init__(self, path: str | Path, tokenizer: Tokenizer | None = None) -> None:
        self.path = Path(path)
        self.tokenizer = tokenizer or ByteTokenizer()

    def prompts(self) -> Iterator[tuple[bytes, int | None]]:
        """(prompt token IDs packed as uint32, max_tokens or None) per line, in order."""
        try:
            with open(self.path, encoding="utf-8") as f:
                for n, line in lines(f, self.path, DatasetError):
                    if line.strip():
                        yield _entry(line, f"{self.path}: line {n}", self.tokenizer)
        except OSError as exc:
            raise DatasetError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise DatasetError(f"{self.path}: not UTF-8 text") from None

    def check(self) -> int:
        """Read the whole file; the number of requests. Raises DatasetError."""
        count = sum(1 for _ in self.prompts())
        if not count:
            raise DatasetError(f"{self.path}: no requests in the file")
        return count
