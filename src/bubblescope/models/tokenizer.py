"""Tokenizers: Hugging Face ``tokenizer.json`` (via the ``tokenizers`` library) and llama2.c's ``tokenizer.bin``.

Both expose ``encode(text, bos=True) -> list[int]`` and ``decode(ids) -> str``.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..errors import BubblescopeError
from ..wording import count


class HFTokenizer:
    """A ``tokenizer.json`` loaded with ``tokenizers.Tokenizer.from_file``."""

    def __init__(self, path: str | Path, bos_token_id: int | None = None):
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exception subclasses from Rust
            raise BubblescopeError(f"{path}: cannot load tokenizer.json ({str(e).splitlines()[0]})") from None
        self.bos_token_id = bos_token_id
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str, bos: bool = True) -> list[int]:
        """Token ids of ``text``; prepends ``bos_token_id`` if asked and the tokenizer did not add it."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if bos and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)


class Llama2cTokenizer:
    """llama2.c ``tokenizer.bin``: int32 max_token_length, then per token float32 score, int32 length, bytes.

    Encoding follows llama2.c ``run.c`` ``encode``: prepend a space (SentencePiece's dummy prefix), map each
    UTF-8 code point to its piece or, if absent, to byte-fallback ids ``<0xXX>`` = byte + 3, then repeatedly
    merge the adjacent pair whose concatenation is a piece with the highest score (first such pair on ties).
    Ids 0, 1, 2 are ``<unk>``, BOS and EOS.
    """

    BOS, EOS = 1, 2

    def __init__(self, path: str | Path, vocab_size: int | None = None):
        p = Path(path)
        if not p.is_file():
            raise BubblescopeError(f"{path}: no such tokenizer file")
        data = p.read_bytes()
        pieces, scores = [], []
        off = 0  # an empty or 3-byte file fails on the header, before off is set there
        try:
            (self.max_token_length,) = struct.unpack_from("<i", data, 0)
            off = 4
            while off < len(data) and (vocab_size is None or len(pieces) < vocab_size):
                score, n = struct.unpack_from("<fi", data, off)
                off += 8
                if n < 0 or off + n > len(data):
                    raise struct.error("piece length out of range")
                pieces.append(data[off:off + n])
                scores.append(score)
                off += n
        except struct.error:
            raise BubblescopeError(f"{p}: not a llama2.c tokenizer file (truncated at byte {off})") from None
        if vocab_size is not None and len(pieces) != vocab_size:
            raise BubblescopeError(f"{p}: holds {count(len(pieces), 'token')}, the model expects {vocab_size}")
        self.pieces = pieces
        self.scores = scores
        self.vocab_size = len(pieces)
        self._lookup = {piece: i for i, piece in reversed(list(enumerate(pieces)))}

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        ids: list[int] = []
        if text:
            for ch in " " + text:
                b = ch.encode("utf-8")
                i = self._lookup.get(b)
                ids.extend([i] if i is not None else [c + 3 for c in b])
        while len(ids) > 1:
            best, best_i = None, -1
            for i in range(len(ids) - 1):
                j = self._lookup.get(self.pieces[ids[i]] + self.pieces[ids[i + 1]])
                if j is not None and (best is None or self.scores[j] > self.scores[best]):
                    best, best_i = j, i
            if best is None:
                break
            ids[best_i:best_i + 2] = [best]
        return ([self.BOS] if bos else []) + ids + ([self.EOS] if eos else [])

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``: BOS/EOS dropped, byte-fallback pieces ``<0xXX>`` joined back into UTF-8, and the
        dummy-prefix space that ``encode`` (SentencePiece) put in front taken off again."""
        out = bytearray()
        for t in ids:
            if t in (self.BOS, self.EOS):
                continue
            piece = self.pieces[t]
            if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
                try:
                    piece = bytes([int(piece[3:5], 16)])
                except ValueError:
                    pass
            out += piece
        text = out.decode("utf-8", errors="replace")
        return text[1:] if text.startswith(" ") else text


def load_tokenizer(path: str | Path, vocab_size: int | None = None, bos_token_id: int | None = None):
    """A tokenizer from ``tokenizer.json`` (Hugging Face) or a llama2.c ``*.bin``.

    Raises:
        BubblescopeError: the file is missing or unreadable.
    """
    p = Path(path)
    if not p.is_file():
        raise BubblescopeError(f"{path}: no such tokenizer file")
    if p.suffix == ".json":
        return HFTokenizer(p, bos_token_id)
    return Llama2cTokenizer(p, vocab_size)
