"""A minimal decoder for Hugging Face tokenizer.json files, enough for the engine's `text` field.

Byte-level BPE (Qwen, GPT-2) maps every byte to a printable character; decoding inverts that map and
reads the bytes as UTF-8. Other decoders fall back to joining token strings (SentencePiece's U+2581 as
a space). With no tokenizer.json at all, `text` is the empty string.
"""

import json
import os


def _byte_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Detokenizer:
    def __init__(self, folder):
        self.tokens = {}
        self.special = set()
        self.byte_level = False
        path = os.path.join(folder, "tokenizer.json")
        self.available = os.path.isfile(path)
        if not self.available:
            return
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        vocab = (spec.get("model") or {}).get("vocab") or {}
        if isinstance(vocab, dict):
            self.tokens = {i: t for t, i in vocab.items()}
        elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            self.tokens = {i: p[0] for i, p in enumerate(vocab)}
        for t in spec.get("added_tokens") or []:
            self.tokens[t["id"]] = t["content"]
            if t.get("special"):
                self.special.add(t["id"])
        self.byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
        self.bytes_of = _byte_chars()

    def decode(self, ids, skip_special_tokens=True):
        if not self.available:
            return ""
        out = []
        buf = []  # byte-level pieces accumulate until a special token or the end, then decode as UTF-8

        def flush():
            if buf:
                out.append(bytes(buf).decode("utf-8", errors="replace"))
                buf.clear()

        for i in ids:
            tok = self.tokens.get(i)
            if tok is None:
                continue
            if i in self.special:
                if not skip_special_tokens:
                    flush()
                    out.append(tok)
                continue
            if self.byte_level:
                for ch in tok:
                    b = self.bytes_of.get(ch)
                    if b is None:
                        buf.extend(ch.encode("utf-8"))
                    else:
                        buf.append(b)
            else:
                out.append(tok.replace("\u2581", " "))
        flush()
        return "".join(out)
