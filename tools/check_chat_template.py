#!/usr/bin/env python3
"""tools/check_chat_template.py — Loom's rendering of a model's Jinja chat template against
transformers' apply_chat_template (pip install transformers jinja2; no torch needed) on the same
tokenizer, template and conversations. Used by tests/data/chat_jinja_test.cpp.

  check_chat_template.py --tokenize build/bin/tokenize --tokenizer DIR --template FILE.jinja \
      --eot TEXT --conversations FILE.jsonl...

DIR holds a tokenizer.json (and tokenizer_config.json for bos_token/eos_token); the template is
put into a copy of its config for Loom. For every conversation: the text (all turns) and the
generation prompt (all turns but the last, add_generation_prompt) equal transformers'; the ids
equal apply_chat_template's (a difference is reported: Loom tokenizes the contents apart from the
template, Note [Jinja chat rendering]); the mask's runs are exactly the assistant turns, each
decoding to its content (as the template prints it: as is, or trimmed) and then TEXT, the
end-of-turn text. Exits 1 on any mismatch.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from transformers import PreTrainedTokenizerFast


def conversations(paths):
    out = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                j = json.loads(line)
                if "messages" in j:
                    out.append((line.rstrip("\n"), j["messages"]))
                else:
                    out.append((line.rstrip("\n"), [{"role": "user", "content": j["prompt"]},
                                                    {"role": "assistant",
                                                     "content": j["response"]}]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenize", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--eot", required=True)
    ap.add_argument("--conversations", nargs="+", required=True)
    a = ap.parse_args()
    with open(a.template, encoding="utf-8") as f:
        template = f.read()
    cfg_path = os.path.join(a.tokenizer, "tokenizer_config.json")
    cfg = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
    bos, eos = cfg.get("bos_token"), cfg.get("eos_token")
    tmp = tempfile.mkdtemp(prefix="loom_chat_")
    try:
        shutil.copy(os.path.join(a.tokenizer, "tokenizer.json"), tmp)
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": bos, "eos_token": eos, "chat_template": template}, f)
        hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tmp, "tokenizer.json"),
                                     bos_token=bos, eos_token=eos)
        hf.chat_template = template
        convs = conversations(a.conversations)
        run = subprocess.run([a.tokenize, "chat", "--tokenizer", "hf:" + tmp],
                             input="".join(line + "\n" for line, _ in convs).encode(),
                             capture_output=True, check=False)
        if run.returncode != 0:
            sys.exit("tokenize chat failed: " + run.stderr.decode(errors="replace"))
        got = [json.loads(l) for l in run.stdout.decode().split("\n") if l]
    finally:
        shutil.rmtree(tmp)

    bad = ids_differ = 0
    for (line, messages), g in zip(convs, got):
        problems = []
        text = hf.apply_chat_template(messages, tokenize=False)
        if g["text"] != text:
            problems.append("text: loom %r\n    transformers %r" % (g["text"][:200], text[:200]))
        prompt = hf.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        if g["prompt"] != prompt:
            problems.append("prompt: loom %r\n    transformers %r" % (g["prompt"][-80:],
                                                                     prompt[-80:]))
        ids = hf.apply_chat_template(messages, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        if g["ids"] != list(ids):
            ids_differ += 1
        # The mask's runs: one per assistant turn, each its content and the end-of-turn text.
        runs, cur = [], None
        for t, m in zip(g["ids"], g["mask"]):
            if m and cur is None:
                cur = []
            if m:
                cur.append(t)
            elif cur is not None:
                runs.append(cur)
                cur = None
        if cur is not None:
            runs.append(cur)
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        if len(runs) != len(replies):
            problems.append("mask: %d runs for %d assistant turns" % (len(runs), len(replies)))
        # A run's text: the whole text's decoding up to its end less that up to its start (a
        # decoder treats a text's first token apart). Leading whitespace is not compared: a token
        # may join a reply's first word to the space or newline the template put before it.
        starts = [k for k in range(len(g["mask"])) if g["mask"][k] and (k == 0 or not g["mask"][k - 1])]
        for (run_ids, start), reply in zip(zip(runs, starts), replies):
            whole = hf.decode(g["ids"][:start + len(run_ids)])
            decoded = whole[len(hf.decode(g["ids"][:start])):]
            if decoded.lstrip() not in ((reply + a.eot).lstrip(), reply.strip() + a.eot):
                problems.append("mask run decodes to %r, not the reply %r + %r" %
                                (decoded, reply, a.eot))
        if problems:
            bad += 1
            if bad <= 5:
                print("conversation %r:\n  %s" % (line[:80], "\n  ".join(problems)))
    print("%s with %s: %d conversations, %d differ in text, prompt or mask; ids equal "
          "transformers' in %d" % (os.path.basename(a.template), a.tokenizer, len(convs), bad,
                                   len(convs) - ids_differ))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
