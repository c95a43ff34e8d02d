#!/usr/bin/env python3
"""Writes the tokenizer.json that Hugging Face's LlamaTokenizerFast holds for a
SentencePiece BPE model (the Llama 2 / Mistral layout: transformers' LlamaConverter in
its legacy form), and the reference ids SentencePiece itself gives on a sample, for
kvbudget's tokenizer test (issue 21 item 5).

Why this script: scripts/make_tokenizer_references.py trains the SentencePiece model on
the GPU machine, where transformers 5.17's LlamaTokenizerFast(from_slow=True) wrote an
empty tokenizer.json; the conversion is small and documented, so it is done here with
Debian's python3-sentencepiece (protobuf access to the model). What it writes, as the
converter does:
  model          BPE: vocab = the model's pieces by id (<unk>, <s>, </s> first), merges
                 = every split of a piece into two pieces of the vocabulary, ordered by
                 the merged piece's score (highest first; ties keep the order of the
                 pieces, then of the left and right ids), byte_fallback, fuse_unk,
                 unk_token = the trainer's unk piece
  normalizer     Sequence[Prepend("▁"), Replace(" ", "▁")]
  pre_tokenizer  null (the whole normalized text is one word)
  post_processor TemplateProcessing "<s> $A"
  decoder        Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)]
  added_tokens   <unk>, <s>, </s> (special)
The reference ids are SentencePiece's (`SentencePieceProcessor.encode`, BOS first): the
implementation Llama 2 and Mistral were trained with. Cases whose text holds a control
token's literal ("<s>") are left out: SentencePiece encodes such text as characters,
Hugging Face's tokenizer as the special token.

    /usr/bin/python3 scripts/spm_to_tokenizer_json.py DIR   # DIR/tokenizer.model in,
        # DIR/tokenizer.json and DIR/reference_ids.json out (cases from DIR/reference_ids.json
        # of make_tokenizer_references.py when present, else from its SAMPLES)
"""
import json
import sys
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

BYTE, CONTROL, UNKNOWN = 6, 3, 2  # ModelProto.SentencePiece.Type


def merges_of(pieces):
    """[(left, right)] in rank order, as transformers' SentencePieceExtractor builds them."""
    vocab = {p.piece: i for i, p in enumerate(pieces)}
    merges = []
    for piece in pieces:
        local = [(piece.piece[:k], piece.piece[k:], piece.score) for k in range(1, len(piece.piece))
                 if piece.piece[:k] in vocab and piece.piece[k:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges = sorted(merges, key=lambda m: m[2], reverse=True)  # stable: ties keep the order above
    return [f"{l} {r}" for l, r, _ in merges]


def tokenizer_json(proto):
    pieces = list(proto.pieces)
    if proto.trainer_spec.model_type != 2:
        raise SystemExit("spm_to_tokenizer_json: not a BPE model (trainer_spec.model_type != BPE)")
    vocab = {p.piece: i for i, p in enumerate(pieces)}
    added = [{"id": i, "content": p.piece, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, p in enumerate(pieces) if p.type in (CONTROL, UNKNOWN)]
    bos = proto.trainer_spec.bos_piece
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 0}}],
            "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": proto.trainer_spec.unk_piece,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab, "merges": merges_of(pieces)},
    }


def main():
    d = Path(sys.argv[1])
    proto = model_pb2.ModelProto()
    proto.ParseFromString((d / "tokenizer.model").read_bytes())
    (d / "tokenizer.json").write_text(json.dumps(tokenizer_json(proto), ensure_ascii=False, indent=1) + "\n",
                                      encoding="utf-8")
    sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    controls = [p.piece for p in proto.pieces if p.type in (CONTROL, UNKNOWN)]
    old = json.loads((d / "reference_ids.json").read_text(encoding="utf-8")) if (d / "reference_ids.json").exists() else None
    if old:
        texts = [c["text"] for c in old["cases"]]
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from make_tokenizer_references import sample_cases
        texts = sample_cases()
    cases, left_out = [], []
    for text in texts:
        if any(c in text for c in controls):
            left_out.append(text)
            continue
        ids = sp.encode(text)
        cases.append({"text": text, "ids": [sp.bos_id()] + ids, "ids_no_special": ids, "decoded": sp.decode(ids)})
    doc = {"implementation": f"sentencepiece {spm.__version__} SentencePieceProcessor.encode (BOS first in ids); "
                             "tokenizer.json converted by scripts/spm_to_tokenizer_json.py",
           "trained_with": old.get("versions") if old else None,
           "left_out_because_they_hold_control_token_literals": left_out,
           "cases": cases}
    (d / "reference_ids.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{d}: {len(proto.pieces)} pieces, {len(cases)} cases ({len(left_out)} left out)")


if __name__ == "__main__":
    main()
