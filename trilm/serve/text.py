"""Streaming text from generated tokens: incremental detokenization and stop strings.

SentencePiece decoding is not a concatenation of per-token strings: a leading "▁" becomes a space except
at the start of a decode, and byte-fallback pieces only form characters together. So each new token's
text is the difference between two decodes of a short window that starts a few tokens back (the last
prompt tokens at first, which also gives the first generated word its leading space), and text that
ends in an incomplete UTF-8 sequence is held until the character is complete.

Stop strings are matched on the text, across token boundaries. Text that could still turn into a stop
string is held back, so a client never receives characters that are later taken back.
"""

from __future__ import annotations

from trilm.data.tokenizer import Tokenizer

CONTEXT_TOKENS = 4
"""Prompt tokens kept as decoding context for the first generated token."""
_INCOMPLETE = "\ufffd"


class TextStream:
    """Turns generated token ids into text deltas, ending at the first stop string."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix = 0
        self.read = len(self.ids)
        self.text = ""
        self.emitted = 0
        self.stop = stop
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one generated token; returns the text that may now be sent (possibly empty)."""
        self.ids.append(token)
        new = self._decode_new(final=False)
        if not new:
            return ""
        before = len(self.text)
        self.text += new
        if self.stop:
            cut = self._find_stop(before)
            if cut is not None:
                self.text = self.text[:cut]
                self.stopped = True
                return self._emit(len(self.text))
            return self._emit(len(self.text) - self._held_back())
        return self._emit(len(self.text))

    def finish(self) -> str:
        """The text still held back (an incomplete character, a partial stop string) at the end."""
        if not self.stopped:
            self.text += self._decode_new(final=True)
        return self._emit(len(self.text))

    def _decode_new(self, final: bool) -> str:
        decode = self.tokenizer.decode
        seen = decode(self.ids[self.prefix : self.read])
        full = decode(self.ids[self.prefix :])
        if len(full) <= len(seen) or (full.endswith(_INCOMPLETE) and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return full[len(seen) :]

    def _find_stop(self, before: int) -> int | None:
        hits = []
        for s in self.stop:
            i = self.text.find(s, max(0, before - len(s) + 1))
            if i >= 0:
                hits.append(i)
        return min(hits) if hits else None

    def _held_back(self) -> int:
        """Length of the longest end of the text that is a proper prefix of a stop string."""
        unsent = len(self.text) - self.emitted
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, unsent), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _emit(self, upto: int) -> str:
        if upto <= self.emitted:
            return ""
        out = self.text[self.emitted : upto]
        self.emitted = upto
        return out
