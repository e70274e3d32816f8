#!/usr/bin/env python3
"""tools/make_test_tokenizers.py OUT_DIR — Hugging Face tokenizer.json files for Loom's tokenizer
tests (tests/data/hf_tokenizer_test.cpp), made with the `tokenizers` library itself (pip install
tokenizers), so each is in the format real models ship:

  OUT_DIR/gpt2/      GPT-2's shipped BPE (data/gpt2-bpe) as a tokenizer.json: ByteLevel with
                     GPT-2's regex, <|endoftext|> special.
  OUT_DIR/bytesplit/ the same vocabulary behind Llama 3's layout: NFC normalizer, a Split regex
                     (Llama 3's pattern), ByteLevel without regex, ignore_merges, a BOS template,
                     Llama 3's and ChatML's control tokens as special tokens.
  OUT_DIR/spbpe/     SentencePiece-style BPE with byte fallback in Llama 2's layout (Prepend and
                     Replace normalizers, no pre-tokenizer, <0xXX> byte tokens, Replace/
                     ByteFallback/Fuse/Strip decoder, "<s> $A" template), trained here on the
                     texts given.
  OUT_DIR/spmeta/    the same model in the newer layout (Metaspace pre-tokenizer and decoder,
                     prepend_scheme "first").

Each directory also holds a tokenizer_config.json naming bos_token and eos_token. The texts to
train on: --train FILE... (plain text).
"""
import argparse
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers, AddedToken, Regex

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def save(tok, out, bos, eos):
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": bos, "eos_token": eos}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--bpe-dir", required=True, help="data/gpt2-bpe")
    ap.add_argument("--train", nargs="+", required=True)
    a = ap.parse_args()

    vocab = os.path.join(a.bpe_dir, "encoder.json")
    merges = os.path.join(a.bpe_dir, "vocab.bpe")
    gpt2 = Tokenizer(models.BPE.from_file(vocab, merges))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    gpt2.post_processor = processors.ByteLevel(trim_offsets=False)
    gpt2.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    save(gpt2, os.path.join(a.out, "gpt2"), None, "<|endoftext|>")

    split = Tokenizer(models.BPE.from_file(vocab, merges, ignore_merges=True))
    split.normalizer = normalizers.NFC()
    split.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    split.decoder = decoders.ByteLevel()
    split.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (
        "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
        "<|end_header_id|>", "<|im_start|>", "<|im_end|>")])
    bos = split.token_to_id("<|begin_of_text|>")
    split.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    save(split, os.path.join(a.out, "bytesplit"), "<|begin_of_text|>", "<|end_of_text|>")

    specials = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    for name in ("spbpe", "spmeta"):
        sp = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        if name == "spbpe":
            sp.normalizer = normalizers.Sequence(
                [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
            sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                            decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        else:
            sp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                        split=False)
            sp.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁",
                                                               prepend_scheme="first",
                                                               split=False),
                                            decoders.ByteFallback(), decoders.Fuse()])
        trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials,
                                      show_progress=False, max_token_length=16)
        sp.train(a.train, trainer)
        # <unk>, <s> and </s> special (as Llama 2 has them); the byte tokens are vocabulary.
        sp.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t in ("<unk>", "<s>", "</s>")])
        sp.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", sp.token_to_id("<s>"))])
        save(sp, os.path.join(a.out, name), "<s>", "</s>")
    return 0


if __name__ == "__main__":
    sys.exit(main())
