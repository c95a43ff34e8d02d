#!/usr/bin/env python3
"""Trains small tokenizers with the pipelines of the models people use, and writes the ids
that the reference implementations give on a sample, for kvbudget's tokenizer tests
(issue 21 item 5). Real vocabularies cannot be downloaded where kvbudget is developed, so
the vocabularies are small ones trained on the bundled texts; what is checked is the
pipeline (normalizer, pre-tokenizer pattern, merges, byte fallback, special tokens):

  llama3   byte-level BPE with Llama 3's pre-tokenizer pattern, `ignore_merges`, its
           special tokens appended after the vocabulary and BOS added by the template
  qwen2    byte-level BPE with Qwen2's pattern (single digits) and NFC normalizer,
           its special tokens, no BOS
  spm      SentencePiece BPE with Llama 2's / Mistral's trainer settings (byte fallback,
           split digits, dummy prefix, identity normalization), converted to
           tokenizer.json as LlamaTokenizerFast does by scripts/spm_to_tokenizer_json.py;
           the ids are SentencePiece's own

Needs `tokenizers`, `sentencepiece` and `transformers` (not Debian packages; the GPU
machine has them):

    python3 scripts/make_tokenizer_references.py OUT_DIR

writes OUT_DIR/<name>/tokenizer.json (+ tokenizer.model for spm) and
OUT_DIR/<name>/reference_ids.json: {"implementation": ..., "versions": ...,
"cases": [{"text", "ids", "ids_no_special", "decoded"}]} over SAMPLES and the bundled
sample text, so the C++ tokenizer is tested against ids it did not compute itself."""

import json
import sys
import tempfile
import traceback
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1]
TEXTS = sorted((SOURCE / "data" / "text").glob("*.txt"))

# Pre-tokenizer patterns as the models' tokenizer.json files write them.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Hand-picked cases for the corners of the pipelines: contractions in any case, digit runs,
# whitespace runs and line breaks, punctuation runs, non-ASCII letters and numbers,
# combining characters (NFC), emoji (byte fallback), special tokens written in the text.
SAMPLES = [
    "Hello, world!",
    " leading space and  two spaces   three",
    "I'LL say it's done; they'd've WON'T you'Re",
    "1234567 89 0.5 -42 1,000,000 3.14159 2026-11-26",
    "tabs\tand\nnewlines\n\n\nand\r\nwindows\r\n  indented\n    more",
    "trailing spaces   ",
    "   ",
    "",
    "naïve café Ünïcödé façade résumé Straße",
    "e\u0301 (e + combining acute) versus \u00e9",
    "Ελληνικά русский 中文字符 日本語のテキスト 한국어",
    "١٢٣ Arabic-Indic digits, ½ ⅔ Ⅻ roman",
    "emoji 😀👍🏽 and symbols ™ © ∑ ≤ ≥ → ✓",
    "!!!??? ... --- *** ((()))[]{} <<>> @#$%^&",
    "<|begin_of_text|>special<|eot_id|> tokens <|im_start|>user\nhi<|im_end|> <s> </s>",
    "def f(x):\n    return x**2  # comment\n",
    "http://example.com/path?q=1&r=2 user@example.org",
    "MixedCASE camelCase snake_case kebab-case UPPER",
]


def versions():
    out = {"python": sys.version.split()[0]}
    for mod in ("tokenizers", "sentencepiece", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 (recorded, not fatal)
            out[mod] = f"unavailable: {e}"
    return out


def sample_cases():
    texts = list(SAMPLES)
    for path in TEXTS:  # the first 2000 bytes of each bundled text, cut at a line break
        text = path.read_text(encoding="utf-8")[:2000]
        texts.append(text[: text.rfind("\n") + 1])
    return texts


def byte_level_bpe(pattern, normalizer, special_tokens, bos, ignore_merges, vocab_size):
    """A byte-level BPE trained on the bundled texts, pipeline as Llama 3 / Qwen2."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    try:
        model = models.BPE(ignore_merges=ignore_merges)
    except TypeError:  # tokenizers < 0.19 has no ignore_merges
        if ignore_merges:
            raise
        model = models.BPE()
    tok = Tokenizer(model)
    if normalizer == "NFC":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([str(p) for p in TEXTS], trainer)
    tok.add_special_tokens(special_tokens)  # after the vocabulary, as in the real files
    steps = [processors.ByteLevel(trim_offsets=False)]
    if bos:
        steps.append(processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                   special_tokens=[(bos, tok.token_to_id(bos))]))
    tok.post_processor = processors.Sequence(steps)
    return tok


def hf_cases(tok):
    cases = []
    for text in sample_cases():
        ids = tok.encode(text).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "ids_no_special": plain,
                      "decoded": tok.decode(plain, skip_special_tokens=False)})
    return cases


def write(out, name, implementation, cases, extra=None):
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    doc = {"implementation": implementation, "versions": versions(), "cases": cases}
    doc.update(extra or {})
    (d / "reference_ids.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{name}: {len(cases)} cases, {sum(len(c['ids']) for c in cases)} ids")


def make_llama3(out):
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = byte_level_bpe(LLAMA3_PATTERN, None, specials, "<|begin_of_text|>", True, 1024)
    (out / "llama3").mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "llama3" / "tokenizer.json"))
    write(out, "llama3", "tokenizers.Tokenizer (Hugging Face tokenizers, Rust)", hf_cases(tok))


def make_qwen2(out):
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = byte_level_bpe(QWEN2_PATTERN, "NFC", specials, None, False, 1024)
    (out / "qwen2").mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "qwen2" / "tokenizer.json"))
    write(out, "qwen2", "tokenizers.Tokenizer (Hugging Face tokenizers, Rust)", hf_cases(tok))


def train_spm(d):
    """d/tokenizer.model: a SentencePiece BPE trained on the bundled texts with Llama 2's
    trainer settings (its tokenizer.model's trainer_spec), a smaller vocabulary."""
    import sentencepiece as spm

    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("".join(p.read_text(encoding="utf-8") for p in TEXTS), encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(d / "tokenizer"), vocab_size=1000, model_type="bpe",
            byte_fallback=True, split_digits=True, add_dummy_prefix=True, normalization_rule_name="identity",
            remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, character_coverage=0.99995,
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1, max_sentence_length=1 << 20, minloglevel=2)
    (d / "tokenizer.vocab").unlink(missing_ok=True)


def make_spm(out):
    """Trains the SentencePiece model, then writes tokenizer.json and SentencePiece's ids
    with scripts/spm_to_tokenizer_json.py (transformers 5.17's LlamaTokenizerFast(from_slow)
    wrote an empty tokenizer.json); where `tokenizers` is there, also checks that it gives
    SentencePiece's ids on the converted file."""
    d = out / "spm"
    train_spm(d)
    sys.path.insert(0, str(Path(__file__).parent))
    import spm_to_tokenizer_json

    sys.argv = [sys.argv[0], str(d)]
    spm_to_tokenizer_json.main()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    doc = json.loads((d / "reference_ids.json").read_text(encoding="utf-8"))
    differ = [c["text"] for c in doc["cases"] if tok.encode(c["text"]).ids != c["ids"]]
    print(f"spm: tokenizers {versions()['tokenizers']} on the converted tokenizer.json differs from SentencePiece "
          f"on {len(differ)} of {len(doc['cases'])} cases")


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tokenizer_references")
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(versions()))
    failed = 0
    for make in (make_llama3, make_qwen2, make_spm):
        try:
            make(out)
        except Exception:  # noqa: BLE001 (each tokenizer on its own; the log says why)
            failed += 1
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
