"""Tokenizers: Hugging Face ``tokenizer.json`` (via the ``tokenizers`` library) and llama2.c's ``tokenizer.bin``.

Both expose ``encode(text, bos=True) -> list[int]`` and ``decode(ids) -> str``.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..errors import BubblescopeError
from ..wording import count


class TokenizerCutShort(BubblescopeError):
    """The tokenizer file ends before its data does (an interrupted download or copy): the file is damaged,
    whoever found it, so it is refused even where a tokenizer that merely fails to load is only a warning."""


def _check_json_whole(path: Path) -> None:
    """Raise :class:`TokenizerCutShort` when ``path``'s JSON text ends inside its value (the decoder's error
    lies at the end of the text: an unclosed object, array or string); other JSON errors are left to the
    tokenizers library to report."""
    import json

    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return  # unreadable: Tokenizer.from_file says why
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
            raise TokenizerCutShort(f"{path}: cut short: its JSON ends after {len(text.encode())} bytes inside a "
                                    "value (a truncated tokenizer.json; download or copy it again)") from None
    except RecursionError:
        return


class HFTokenizer:
    """A ``tokenizer.json`` loaded with ``tokenizers.Tokenizer.from_file``.

    Raises:
        TokenizerCutShort: the file's JSON ends inside a value (truncated).
        BubblescopeError: the file cannot be read or is no tokenizer the library knows.
    """

    def __init__(self, path: str | Path, bos_token_id: int | None = None):
        from tokenizers import Tokenizer

        _check_json_whole(Path(path))
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

    The file has no token count: a file cut short between two tokens is told only against ``vocab_size``
    (the model's), which ``load_model`` always passes.

    Raises:
        TokenizerCutShort: the file ends inside its header or a token, or after fewer than ``vocab_size``
            tokens.
        BubblescopeError: no such file.
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
            raise TokenizerCutShort(f"{p}: not a llama2.c tokenizer file (truncated at byte {off})") from None
        if vocab_size is not None and len(pieces) != vocab_size:
            raise TokenizerCutShort(f"{p}: holds {count(len(pieces), 'token')}, the model expects {vocab_size} "
                                    "(a truncated file, or another model's tokenizer)")
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
