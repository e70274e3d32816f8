#!/usr/bin/env python3
"""tools/check_hf_roundtrip.py — transformers against Loom's Hugging Face conversion, both ways.

For a small GPT-2, a small Llama (grouped-query heads, untied head) and the families in Llama's
layout (Note [Hugging Face families] in train/hf_format.h: Llama with each RoPE scaling — llama3,
linear, yarn —, an explicit head_dim and every bias; Qwen2; Qwen3 with its q/k norms; Mistral
with its head_dim and a sliding window shorter than the sequence), all on the CPU in f64:
  1. transformers builds a randomly initialised model (biases and norm weights drawn too: its
     own init sets them to 0 and 1) and saves it (save_pretrained, safetensors);
  2. `convert` reads that directory into a Loom checkpoint, and writes the checkpoint back out as
     a Hugging Face directory;
  3. `dump_logits` runs Loom's forward on the checkpoint's weights (model.init_from);
  4. transformers loads both directories (the original and Loom's export) and runs them on the
     same ids: each must give Loom's logits within --tol (max abs), and the two directories the
     same logits as each other.
Needs torch and transformers (the GPU machine has them; CI does not, and skips: exit 77).

  python3 tools/check_hf_roundtrip.py --bin build/bin [--tol 1e-4] [--work /tmp/hf_roundtrip]
"""
import argparse
import json
import os
import struct
import subprocess
import sys


def read_safetensors(path, np):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, t = e["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64}[e["dtype"]]
        out[name] = np.frombuffer(data[b:t], dtype=dt).reshape(e["shape"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--work", default="/tmp/loom_hf_roundtrip")
    a = ap.parse_args()
    try:
        import numpy as np
        import torch
        import transformers
    except ImportError as e:
        print(f"check_hf_roundtrip: skipped: {e} (needs torch and transformers)")
        return 77
    torch.manual_seed(0)
    V, C, L, T = 1000, 64, 2, 32
    cases = {
        "gpt2": (transformers.GPT2Config(vocab_size=V, n_positions=T, n_embd=C, n_layer=L, n_head=4,
                                         activation_function="gelu_new", resid_pdrop=0.0,
                                         embd_pdrop=0.0, attn_pdrop=0.0),
                 transformers.GPT2LMHeadModel,
                 f"model: {{arch: gpt2, vocab_size: {V}, n_layer: {L}, n_head: 4, n_embd: {C}, "
                 f"max_seq_len: {T}}}"),
        "llama": (transformers.LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=96,
                                           num_hidden_layers=L, num_attention_heads=4,
                                           num_key_value_heads=2, max_position_embeddings=T,
                                           rms_norm_eps=1e-5, tie_word_embeddings=False),
                  transformers.LlamaForCausalLM,
                  f"model: {{arch: llama, vocab_size: {V}, n_layer: {L}, n_head: 4, n_kv_head: 2, "
                  f"n_embd: {C}, ffn_hidden: 96, max_seq_len: {T}, norm_eps: 1.0e-5, "
                  f"tie_embeddings: false}}"),
    }
    llama_args = dict(vocab_size=V, hidden_size=C, intermediate_size=96, num_hidden_layers=L,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    llama_yaml = (f"arch: llama, vocab_size: {V}, n_layer: {L}, n_head: 4, n_kv_head: 2, "
                  f"n_embd: {C}, ffn_hidden: 96, max_seq_len: {T}, norm_eps: 1.0e-5, "
                  f"tie_embeddings: false")
    # RoPE scalings whose pre-training context (8 or 16) is below T, so every branch of each
    # formula turns some of the 12 frequencies of head_dim 24.
    scalings = {
        "llama3": ({"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8},
                   "{type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, "
                   "original_max_seq_len: 8}"),
        "linear": ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
                   "{type: linear, factor: 2}"),
        "yarn": ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                  "original_max_position_embeddings": 16},
                 "{type: yarn, factor: 4, original_max_seq_len: 16}"),
    }
    for kind, (rope, rope_yaml) in scalings.items():
        cases["llama_" + kind] = (
            transformers.LlamaConfig(**llama_args, head_dim=24, rope_parameters=rope,
                                     attention_bias=True, mlp_bias=True),
            transformers.LlamaForCausalLM,
            f"model: {{{llama_yaml}, head_dim: 24, attention_bias: true, mlp_bias: true, "
            f"rope_scaling: {rope_yaml}}}")
    cases["qwen2"] = (transformers.Qwen2Config(**llama_args), transformers.Qwen2ForCausalLM,
                      f"model: {{{llama_yaml}, qkv_bias: true}}")
    cases["qwen3"] = (transformers.Qwen3Config(**llama_args, head_dim=24, attention_bias=True),
                      transformers.Qwen3ForCausalLM,
                      f"model: {{{llama_yaml}, head_dim: 24, attention_bias: true, "
                      f"qk_norm: true}}")
    # A window shorter than the sequence (12 < T), so that it masks (Note [Sliding window]).
    cases["mistral"] = (transformers.MistralConfig(**llama_args, head_dim=32, sliding_window=12),
                        transformers.MistralForCausalLM,
                        f"model: {{{llama_yaml}, head_dim: 32, sliding_window: 12}}")
    worst_all = 0.0
    for name, (cfg, cls, yaml) in cases.items():
        w = os.path.join(a.work, name)
        os.makedirs(w, exist_ok=True)
        model = cls(cfg).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith(".bias") and "ln" not in pname:
                    p.normal_(0.0, 0.05)
                elif "norm" in pname or ".ln" in pname:
                    p.normal_(1.0, 0.1)
        model.save_pretrained(os.path.join(w, "hf_in"), safe_serialization=True)
        run = lambda *args: subprocess.run(args, check=True, capture_output=True, text=True).stdout
        ckpt = run(os.path.join(a.bin, "convert"), "--from", "hf:" + os.path.join(w, "hf_in"),
                   "--to", "loom:" + os.path.join(w, "loom")).strip()
        run(os.path.join(a.bin, "convert"), "--from", "loom:" + ckpt, "--to",
            "hf:" + os.path.join(w, "hf_out"))
        with open(os.path.join(w, "model.yaml"), "w") as f:
            f.write(yaml + f"\ndata: {{seq_len: {T}}}\n")
        dump = os.path.join(w, "dump.safetensors")
        run(os.path.join(a.bin, "dump_logits"), "--config", os.path.join(w, "model.yaml"), "--set",
            "model.init_from=" + ckpt, "--batch", "2", "--seq", str(T), "--out", dump)
        d = read_safetensors(dump, np)
        ids = torch.from_numpy(d["input_ids"].copy())
        loom_logits = torch.from_numpy(d["logits"][..., :V].astype(np.float64))
        results = {}
        for which in ("hf_in", "hf_out"):
            m = cls.from_pretrained(os.path.join(w, which)).to(torch.float64).eval()
            with torch.no_grad():
                results[which] = m(ids).logits
            err = (results[which] - loom_logits).abs().max().item()
            worst_all = max(worst_all, err)
            print(f"{name} {which}: max |transformers - Loom| = {err:.3e}")
        same = (results["hf_in"] - results["hf_out"]).abs().max().item()
        print(f"{name}: max |original - Loom's export| under transformers = {same:.3e}")
        worst_all = max(worst_all, same)
    ok = worst_all <= a.tol
    print(f"check_hf_roundtrip: {'PASS' if ok else 'FAIL'} (worst {worst_all:.3e}, tol {a.tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
