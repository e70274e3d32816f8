#!/usr/bin/env python3
"""tools/check_hf_tokenizer.py — Loom's tokenizer against the `tokenizers` library (pip install
tokenizers) on the same tokenizer.json and texts: every text's ids (with and without the
post-processor's special tokens, special tokens in the text recognised), and decoding Loom's ids
back (Loom's decode against the library's). Used by tests/data/hf_tokenizer_test.cpp.

  check_hf_tokenizer.py --tokenize build/bin/tokenize --tokenizer DIR_OR_JSON \
      --texts FILE... [--max-texts N]

Texts: a .jsonl file is one JSON string (or object with a "text") per line; any other file is split into paragraphs
(blank lines) and, for fortune files, at lines holding only "%". Prints a summary line and the
first mismatches; exits 1 on any mismatch.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from tokenizers import Tokenizer


def read_texts(paths, limit):
    texts = []
    for p in paths:
        with open(p, "rb") as f:
            raw = f.read()
        if p.endswith(".jsonl"):
            for line in raw.decode("utf-8").split("\n"):
                if line:
                    v = json.loads(line)
                    texts.append(v["text"] if isinstance(v, dict) else v)
            continue
        text = raw.decode("utf-8", errors="replace")
        sep = "\n%\n" if "\n%\n" in text else "\n\n"
        texts += [t for t in text.split(sep) if t]
    return texts[:limit] if limit else texts


def loom(tokenize, spec, mode, lines, extra):
    cmd = [tokenize, mode, "--jsonl", "--tokenizer", "hf:" + spec] + extra
    out = subprocess.run(cmd, input="".join(l + "\n" for l in lines).encode(),
                         capture_output=True, check=False)
    if out.returncode != 0:
        sys.exit("tokenize failed: " + out.stderr.decode(errors="replace"))
    return [json.loads(l) for l in out.stdout.decode().split("\n") if l]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenize", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--texts", nargs="+", required=True)
    ap.add_argument("--max-texts", type=int, default=0)
    a = ap.parse_args()
    path = a.tokenizer
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path)
    texts = read_texts(a.texts, a.max_texts)
    lines = [json.dumps(t, ensure_ascii=False) for t in texts]

    t0 = time.time()
    ref = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    ref_seq = [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]
    t_ref = time.time() - t0
    t0 = time.time()
    got = loom(a.tokenize, path, "encode", lines, ["--allow-special"])
    t_loom = time.time() - t0
    got_seq = loom(a.tokenize, path, "encode", lines, ["--allow-special", "--sequence"])
    decoded = loom(a.tokenize, path, "decode", [json.dumps(ids) for ids in got], [])

    bad = 0
    for i, t in enumerate(texts):
        problems = []
        if got[i] != ref[i]:
            k = next((j for j in range(min(len(got[i]), len(ref[i]))) if got[i][j] != ref[i][j]),
                     min(len(got[i]), len(ref[i])))
            problems.append("ids differ at %d: loom %s, tokenizers %s" %
                            (k, got[i][k:k + 6], ref[i][k:k + 6]))
        if got_seq[i] != ref_seq[i]:
            problems.append("with special tokens: loom %s… tokenizers %s…" %
                            (got_seq[i][:4], ref_seq[i][:4]))
        want = tok.decode(ref[i], skip_special_tokens=False)
        if decoded[i] != want:
            problems.append("decode: loom %r, tokenizers %r" % (decoded[i][:60], want[:60]))
        if problems:
            bad += 1
            if bad <= 5:
                print("text %d %r:\n  %s" % (i, t[:80], "\n  ".join(problems)))
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print("%s: %d texts (%.2f MB, %d tokens): %d differ; tokenizers %.2f s (encode_batch, all "
          "cores), Loom's tokenize %.2f s (one process, with its start-up)" %
          (path, len(texts), mb, sum(map(len, ref)), bad, t_ref, t_loom))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
