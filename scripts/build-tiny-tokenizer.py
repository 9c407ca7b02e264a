#!/usr/bin/env python3
"""Trains the tiny model's byte-level BPE tokenizer and writes it in Hugging Face form.

Plain Python 3 (stdlib only). The result is `tokenizer.json` + `tokenizer_config.json` laid out
like Qwen3's: the same pre-tokenizer regex (single digits, words with one leading non-letter),
ByteLevel bytes-to-unicode mapping, so every string round-trips, and ChatML/rStar2 tokens:

  0 <|endoftext|>  1 <|im_start|>  2 <|im_end|>            special (never produced from text by BPE)
  3 <tool_call> 4 </tool_call> 5 <tool_response> 6 </tool_response>
  7 <reason> 8 </reason> 9 <answer> 10 </answer> 11 <think> 12 </think>
                                                           added, not special (as in Qwen3, they are
                                                           kept when decoding with skip_special_tokens)
  13..268 the 256 byte symbols, then merges up to --vocab-size ids in all.

Corpus: the rStar2 system prompt and tool block (weighted, so each of its words is one token), the
tool-response vocabulary, curriculum-like demonstrations, every FILE given with --corpus, and a fixed
list of Python standard-library modules (code and English docstrings). The committed tokenizer.json
is the canonical artifact; rebuilding on another Python version may pick slightly different merges.

Usage: python3 scripts/build-tiny-tokenizer.py --template fixtures/templates/rstar2.jinja \
         [--corpus FILE ...] [--vocab-size 4096] --out fixtures/tiny
"""

import argparse
import collections
import json
import os
import random
import re
import sys
import sysconfig

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<reason>",
    "</reason>",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
]

# Qwen2/Qwen3's split pattern, verbatim: this is what the runtime tokenizers use.
HF_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The same pattern for Python's `re` (no \p{..}): letters = [^\W\d_], numbers = \d. Equal on the
# ASCII corpus we train on; only used to count words for training.
_L, _N = r"[^\W\d_]", r"\d"
PY_PATTERN = re.compile(
    rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:(?![\r\n])[\W_])?{_L}+|{_N}"
    r"| ?(?:(?!\s)[\W_])+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python_code_with_standard_io",
        "description": (
            "Execute Python code with standard input and capture standard output. This function takes a "
            "Python code string and an input string, provides the input string through standard input "
            "(stdin) to the code, and captures and returns any output produced through standard output "
            "(stdout). If the executed code raises an exception, the error message will be captured and "
            "returned instead."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": (
                        "A string containing Python code to be executed. The code can read from standard "
                        "input using the input() function."
                    ),
                },
                "input": {
                    "type": "string",
                    "description": (
                        "A string that will be provided as standard input to the code when it calls input()."
                    ),
                },
            },
            "required": ["code", "input"],
        },
    },
}

STDLIB_MODULES = [
    "argparse.py", "collections/__init__.py", "fractions.py", "statistics.py", "random.py", "heapq.py",
    "bisect.py", "textwrap.py", "string.py", "functools.py", "json/encoder.py", "json/decoder.py", "csv.py",
    "datetime.py", "numbers.py", "shlex.py", "difflib.py", "calendar.py", "pprint.py", "traceback.py",
]


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode map (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_MAP = bytes_to_unicode()


def template_text(template_path):
    """The literal text of the template (system prompt, tool block, user prefix) plus the tool JSON."""
    with open(template_path, encoding="utf-8") as f:
        raw = f.read()
    literals = re.findall(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"", raw)
    parts = []
    for a, b in literals:
        s = a or b
        s = s.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        parts.append(s)
    parts.append(json.dumps(TOOL_SCHEMA))
    return "".join(parts)


def synthetic_demos(rng, n):
    """Curriculum-shaped text: short reasons, tool calls with code, tool responses, answers."""
    ops = ["+", "-", "*", "%", "//", "**"]
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 99999), rng.randint(2, 9999)
        op = rng.choice(ops)
        code = rng.choice([
            f"print({a} {op} {b})",
            f"a, b = map(int, input().split())\\nprint(a {op} b)",
            f"print(sum(1 for i in range(1, {a} + 1) if i % {b} == 0))",
            f"n = int(input())\\nprint(n * n % {b})",
            f"print(pow({a}, {b}, {rng.randint(2, 999)}))",
        ])
        out.append(
            f"Compute {a} {op} {b}. Let me use Python to compute it.</reason>\n<tool_call>\n"
            f'{{"name": "python_code_with_standard_io", "arguments": {{"code": "{code}", "input": "{a} {b}"}}}}'
            f"\n</tool_call>\n<tool_response>\nTool call success\nstdout: {a * b}\n\nexecution time: 0.01s\n"
            f"</tool_response>\n<reason>The result is {a * b}.</reason>\n<answer>\\boxed{{{a * b}}}</answer>\n"
            "Tool call failure\nreason: runtime_error\nstderr: Traceback (most recent call last):\n"
            '  File "<string>", line 1, in <module>\nNameError: name \'x\' is not defined\n'
            "SyntaxError: invalid syntax\nFailed to decode tool call: Expecting value\n"
        )
    return "".join(out)


def split_added(text):
    """Drops special/added tokens from the training text: they have fixed ids already."""
    pattern = "|".join(re.escape(t) for t in SPECIAL + ADDED)
    return re.split(pattern, text)


def count_words(texts):
    counts = collections.Counter()
    for text, weight in texts:
        for piece in split_added(text):
            for word in PY_PATTERN.findall(piece):
                counts["".join(BYTE_MAP[b] for b in word.encode("utf-8"))] += weight
    return counts


def train_bpe(counts, n_merges):
    """Classic BPE: repeatedly merge the most frequent adjacent pair (ties broken lexically)."""
    words = [list(w) for w in counts]
    freqs = list(counts.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += freqs[i]
            where[(a, b)].add(i)
    merges = []
    while len(merges) < n_merges and pairs:
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0][0], kv[0][1]))
        (a, b), freq = best
        if freq < 2:
            break
        merges.append((a, b))
        joined = a + b
        for i in list(where[(a, b)]):
            w = words[i]
            f = freqs[i]
            for x, y in zip(w, w[1:]):
                pairs[(x, y)] -= f
                if pairs[(x, y)] <= 0:
                    del pairs[(x, y)]
            new = []
            j = 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    new.append(joined)
                    j += 2
                else:
                    new.append(w[j])
                    j += 1
            words[i] = new
            for x, y in zip(new, new[1:]):
                pairs[(x, y)] += f
                where[(x, y)].add(i)
        where.pop((a, b), None)
        pairs.pop((a, b), None)
    return merges


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--template", required=True, help="the chat template (jinja) whose text seeds the corpus")
    ap.add_argument("--corpus", nargs="*", default=[], help="more text files for the corpus")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    texts = [(template_text(args.template), 500), (synthetic_demos(rng, 3000), 1)]
    for path in args.corpus:
        with open(path, encoding="utf-8") as f:
            texts.append((f.read(), 1))
    stdlib = sysconfig.get_paths()["stdlib"]
    for name in STDLIB_MODULES:
        path = os.path.join(stdlib, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                texts.append((f.read(), 1))
    counts = count_words(texts)

    first = len(SPECIAL) + len(ADDED)
    alphabet = [BYTE_MAP[b] for b in range(256)]
    n_merges = args.vocab_size - first - len(alphabet)
    merges = train_bpe(counts, n_merges)
    vocab = {}
    for sym in alphabet:
        vocab[sym] = first + len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, first + len(vocab))

    added = [
        {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": i < len(SPECIAL)}
        for i, tok in enumerate(SPECIAL + ADDED)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": HF_PATTERN}, "behavior": "Isolated", "invert": False},
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab, "merges": [[a, b] for a, b in merges],
        },
    }
    with open(args.template, encoding="utf-8") as f:
        chat_template = f.read()
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for t in added
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    total = first + len(vocab)
    print(f"wrote {args.out}: {total} ids ({len(merges)} merges, {len(counts)} distinct words)", file=sys.stderr)


if __name__ == "__main__":
    main()
