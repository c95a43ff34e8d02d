#!/usr/bin/env python3
"""Writes what Hugging Face `tokenizers` gives, step by step, on texts chosen for the
corners of the pre-tokenizer patterns and of NFC, for kvbudget's tokenizer tests
(tests/model/test_tokenizer_references.cpp; issue 21 item 5). Where
scripts/make_tokenizer_references.py checks whole pipelines on small trained
vocabularies, this checks the steps one by one, on texts no vocabulary has to cover:

  split      the pieces of pre_tokenizers.Split(Regex(P), "isolated") for GPT-2's, Llama 3's
             and Qwen2's pattern P (as the models' tokenizer.json files write them)
  metaspace  the pieces of pre_tokenizers.Metaspace("▁", prepend_scheme, split)
  nfc        normalizers.NFC().normalize_str(text)

Needs `tokenizers` (not a Debian package; the GPU machine has it):

    python3 scripts/make_pretokenizer_references.py data/tokenizers/pretokenizer_references.json
"""

import json
import sys
from pathlib import Path

PATTERNS = {
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "llama3": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "qwen2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
}

SPLIT_TEXTS = [
    # contractions, in any case; U+017F (long s) folds to s under (?i)
    "I'LL say it's done; they'd've WON'T you'Re 'rE 'Ll 'D 'M 'T 'S",
    "'\u017f '\u017F x'' ''s 's's 'x 'lL' '",
    # whitespace runs before words, numbers, symbols, line breaks and the end
    "a  b   c    d", "  lead", "trail  ", " ", "   ", "\n", "\n\n", "x \n y", "x\n \ny", " \n\n x",
    "\t\tx", "x\r\n\r\ny", "  \n  ", "a \n\n  b", "line\n  indented\n\n\n  more\n", "\r\n", " \r\n x",
    "\u00a0x \u00a0 y", "\u3000x\u3000", "a\u2028b\u2029c", "\x0b\x0cx", "\x85x", "a \x1c b\x1d",
    "x\u200by\ufeffz", "end \t", "  \t\n\t  x",
    # numbers
    "1234567 89 0.5 -42 1,000,000", "\u0661\u0662\u0663\u0664 \u00bd\u2154 \u216b x12y a1b2 \u00b2\u00b3",
    " 1234", "12345678901", "\U0001d7cf\U0001d7d0 \U0001d400\U0001d401",
    # punctuation and symbols
    "!!!??? ... --- *** ((()))", " ...\n\n", "(hello) [x] {y}", "--x -- x", "$100 \u20ac5", "a.b,c;d",
    "\u2014x \u2013 y", "emoji \U0001f600\U0001f44d\U0001f3fd and \u2122 \u00a9 \u2211 \u2264", "!\n\nx", " !\r\n",
    "<|begin_of_text|>user\nhi<|eot_id|>", "http://example.com/path?q=1&r=2 user@example.org",
    # letters of other scripts, marks, titlecase and modifier letters
    "na\u00efve caf\u00e9 Stra\u00dfe", "\u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\ud55c\uad6d\uc5b4 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0440\u0443\u0441\u0441\u043a\u0438\u0439",
    "e\u0301 \u0301x x\u0301y", "\u01c5a \u02b0b \u00aac", "\u0915\u093f\u0924\u093e\u092c", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "MixedCASE camelCase snake_case kebab-case", "\x00\x01x\x7f", "def f(x):\n    return x**2  # c\n",
]

METASPACE_TEXTS = ["Hello world", " leading", "a  b", "trailing ", "\u2581already", "x\ty\nz", "\u2581\u2581x \u2581", "one"]

NFC_TEXTS = [
    "e\u0301", "\u1100\u1161\u11a8", "\uac00\u11a8", "a\u0328\u0301", "a\u0301\u0328", "\u212b \u2126",
    "\u0344", "\u0958", "\u1e9b\u0323", "\u0b47\u0b3e \u09c7\u09be", "A\u030a\u0301", "\u00c5\u0301",
    "o\u0308\u0304 \u022b", "\u0041\u0323\u0302 \u1eac", "q\u0307\u0323", "\u0fb2\u0f80 \u0f77",
    "\u3099\u304b\u3099 \u304b\u309a", "\u05d1\u05bc\u05b8", "\u1100\u1100\u1161", "\u0300a\u0300",
    "na\u00efve e\u0301te\u0301 Ha\u0308nsel \u00fcber", "x\u0327\u0301\u0300\u0316", "\U0001d15e \U000110ab",
]


def main():
    from tokenizers import Regex, __version__, normalizers, pre_tokenizers

    out = {"implementation": "tokenizers (Hugging Face, Rust) " + __version__, "split": {}, "metaspace": [], "nfc": []}
    for name, pattern in PATTERNS.items():
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
        out["split"][name] = {"pattern": pattern, "cases": [
            {"text": t, "pieces": [p for p, _ in split.pre_tokenize_str(t)]} for t in SPLIT_TEXTS]}
    for scheme in ("first", "always", "never"):
        for split in (True, False):
            meta = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=split)
            for t in METASPACE_TEXTS:
                out["metaspace"].append({"prepend_scheme": scheme, "split": split, "text": t,
                                         "pieces": [p for p, _ in meta.pre_tokenize_str(t)]})
    nfc = normalizers.NFC()
    out["nfc"] = [{"text": t, "nfc": nfc.normalize_str(t)} for t in NFC_TEXTS]
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "pretokenizer_references.json")
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{path}: {sum(len(v['cases']) for v in out['split'].values())} split cases, "
          f"{len(out['metaspace'])} metaspace cases, {len(out['nfc'])} nfc cases")


if __name__ == "__main__":
    main()
