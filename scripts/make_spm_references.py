#!/usr/bin/env python3
"""Mistral's SentencePiece pipeline for kvbudget's tokenizer tests (issue 21 item 5):
data/tokenizers/spm_metaspace/ (tokenizer.json, tokenizer.model and reference_ids.json
with the ids Hugging Face `tokenizers` gives, `sentencepiece_ids` those of
sentencepiece) were made by this script's make_spm, which trains a SentencePiece BPE with
Llama 2's trainer settings on the bundled texts as scripts/make_tokenizer_references.py
does and assembles it into tokenizer.json files as transformers' LlamaConverter does, in
Llama 2's legacy form (OUT/spm/; data/tokenizers/spm/ holds the lead's conversion of its
own model by scripts/spm_to_tokenizer_json.py instead, checked against sentencepiece's
ids) and in Mistral's later form with a Metaspace pre-tokenizer (OUT/spm_metaspace/).
It uses make_tokenizer_references.py's sample texts and writer. Needs `tokenizers` and
`sentencepiece` (the GPU machine has them):

    python3 scripts/make_spm_references.py OUT_DIR
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tokenizer_references import sample_cases, train_spm, write  # noqa: E402


def llama_merges(vocab, scores):
    """The merges transformers' converter derives from a SentencePiece BPE model
    (convert_slow_tokenizer's SentencePieceExtractor / generate_merges, with the pieces'
    scores): every split of a piece into two pieces of the vocabulary, ordered by the
    piece's score (best first), then by the lengths of the two parts."""
    merges = []
    for piece, score in scores.items():
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def make_spm(out):
    """Llama 2's pipeline (legacy: Prepend and Replace normalizers, no pre-tokenizer) in
    OUT/spm/, Mistral's later one (Metaspace with prepend_scheme "first", no normalizer)
    in OUT/spm_metaspace/, both over the same trained SentencePiece model, assembled with
    `tokenizers` the way transformers' LlamaConverter does (transformers 5.17's own
    conversion fails: LlamaTokenizerFast(vocab_file=...) gives an empty vocabulary and
    LlamaConverter raises in SentencePieceExtractor.extract)."""
    import sentencepiece as spm
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    d = out / "spm"
    train_spm(d)
    sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    scores = {sp.id_to_piece(i): sp.get_score(i) for i in range(sp.get_piece_size())}
    merges = llama_merges(vocab, scores)
    for name, legacy in (("spm", True), ("spm_metaspace", False)):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=sp.id_to_piece(sp.unk_id()), fuse_unk=True,
                                   byte_fallback=True))
        tok.add_special_tokens([AddedToken(sp.id_to_piece(i), normalized=False, special=True)
                                for i in (sp.unk_id(), sp.bos_id(), sp.eos_id())])
        if legacy:
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        # BOS by the template, as LlamaTokenizerFast.update_post_processor sets it (add_bos_token).
        bos = sp.id_to_piece(sp.bos_id())
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, sp.bos_id())])
        (out / name).mkdir(parents=True, exist_ok=True)
        tok.save(str(out / name / "tokenizer.json"))
        tok = Tokenizer.from_file(str(out / name / "tokenizer.json"))
        cases, disagree = [], 0
        for text in sample_cases():
            case = {"text": text, "ids": tok.encode(text).ids,
                    "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
                    "sentencepiece_ids": [sp.bos_id()] + sp.encode(text)}
            case["decoded"] = tok.decode(case["ids_no_special"], skip_special_tokens=False)
            disagree += case["ids"] != case["sentencepiece_ids"]
            cases.append(case)
        write(out, name, f"tokenizers.Tokenizer assembled as transformers' LlamaConverter (legacy={legacy}); "
              "sentencepiece_ids: sentencepiece.SentencePieceProcessor with BOS", cases,
              {"cases_where_converted_differs_from_sentencepiece": disagree})


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tokenizer_references")
    out.mkdir(parents=True, exist_ok=True)
    make_spm(out)


if __name__ == "__main__":
    main()
