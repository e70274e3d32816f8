#!/usr/bin/env python3
"""tools/compare_logits_torch.py — checks Loom's forward pass against Hugging Face transformers.

Reads a file written by `dump_logits` (Loom's weights under Loom's names, the input ids and the
logits Loom computed), builds the same model in transformers (GPT2LMHeadModel or
LlamaForCausalLM) from those weights, runs it in float64 and prints the relative error
||loom - torch|| / ||torch|| over the real vocabulary, and the largest absolute difference.
Exit code 0 when the relative error is at most --tol, 1 otherwise, 2 on bad input.

    python3 tools/compare_logits_torch.py FILE [--tol 1e-4] [--device cuda|cpu]
"""
import argparse
import json
import struct
import sys


def read_metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def gpt2_model(meta, w, torch, transformers):
    L, C, H, V = (int(meta[k]) for k in ("n_layer", "n_embd", "n_head", "vocab_size"))
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=int(meta["max_seq_len"]), n_embd=C,
                                  n_layer=L, n_head=H, layer_norm_epsilon=float(meta["norm_eps"]),
                                  activation_function="gelu_new", resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)
    sd = {"transformer.wte.weight": w["wte.weight"][:V], "transformer.wpe.weight": w["wpe.weight"],
          "transformer.ln_f.weight": w["ln_f.weight"], "transformer.ln_f.bias": w["ln_f.bias"]}
    # transformers' GPT-2 stores its linear maps as Conv1D (in, out): Loom's (out, in) transposed.
    names = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.c_attn": "attn.qkv", "attn.c_proj": "attn.proj",
             "mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj"}
    for i in range(L):
        for hf, lm in names.items():
            wt = w[f"blocks.{i}.{lm}.weight"]
            sd[f"transformer.h.{i}.{hf}.weight"] = wt if hf.startswith("ln") else wt.t().contiguous()
            sd[f"transformer.h.{i}.{hf}.bias"] = w[f"blocks.{i}.{lm}.bias"]
    sd["lm_head.weight"] = w["wte.weight"][:V] if meta.get("tie_embeddings", "true") == "true" \
        else w["lm_head.weight"][:V]
    return cfg, transformers.GPT2LMHeadModel(cfg), sd


def llama_model(meta, w, torch, transformers):
    L, C, H, V = (int(meta[k]) for k in ("n_layer", "n_embd", "n_head", "vocab_size"))
    Hkv, D = int(meta["n_kv_head"]), C // int(meta["n_head"])
    tied = meta.get("tie_embeddings", "false") == "true"
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=int(meta["ffn_hidden"]),
                                   num_hidden_layers=L, num_attention_heads=H,
                                   num_key_value_heads=Hkv, max_position_embeddings=int(meta["max_seq_len"]),
                                   rms_norm_eps=float(meta["norm_eps"]), rope_theta=float(meta["rope_theta"]),
                                   tie_word_embeddings=tied, attention_bias=False, mlp_bias=False)
    sd = {"model.embed_tokens.weight": w["wte.weight"][:V], "model.norm.weight": w["norm_f.weight"],
          "lm_head.weight": (w["wte.weight"] if tied else w["lm_head.weight"])[:V]}
    for i in range(L):
        p = f"blocks.{i}."
        q, k, v = torch.split(w[p + "attn.qkv.weight"], [H * D, Hkv * D, Hkv * D], dim=0)
        sd.update({f"model.layers.{i}.self_attn.q_proj.weight": q, f"model.layers.{i}.self_attn.k_proj.weight": k,
                   f"model.layers.{i}.self_attn.v_proj.weight": v,
                   f"model.layers.{i}.self_attn.o_proj.weight": w[p + "attn.proj.weight"],
                   f"model.layers.{i}.mlp.gate_proj.weight": w[p + "mlp.gate.weight"],
                   f"model.layers.{i}.mlp.up_proj.weight": w[p + "mlp.up.weight"],
                   f"model.layers.{i}.mlp.down_proj.weight": w[p + "mlp.down.weight"],
                   f"model.layers.{i}.input_layernorm.weight": w[p + "attn_norm.weight"],
                   f"model.layers.{i}.post_attention_layernorm.weight": w[p + "mlp_norm.weight"]})
    return cfg, transformers.LlamaForCausalLM(cfg), sd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    try:
        import torch
        import transformers
        from safetensors.torch import load_file
    except ImportError as e:
        print(f"compare_logits_torch: skipped: {e}")
        return 0
    meta = read_metadata(args.file)
    w = load_file(args.file)
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    build = {"gpt2": gpt2_model, "llama": llama_model}.get(meta.get("arch"))
    if build is None:
        print(f"compare_logits_torch: {args.file}: unknown arch {meta.get('arch')!r}")
        return 2
    cfg, model, sd = build(meta, w, torch, transformers)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not m.endswith((".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"))]
    if missing or unexpected:
        print(f"compare_logits_torch: weights do not map: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return 2
    model = model.to(device=dev, dtype=torch.float64).eval()
    V = int(meta["vocab_size"])
    with torch.no_grad():
        ref = model(w["input_ids"].to(dev)).logits
    got = w["logits"][..., :V].to(dev, torch.float64)
    rel = ((got - ref).norm() / ref.norm()).item()
    max_abs = (got - ref).abs().max().item()
    ok = rel <= args.tol and got.isfinite().all().item()
    print(f"compare_logits_torch: {meta.get('arch')} L={meta['n_layer']} C={meta['n_embd']} "
          f"loom on {meta.get('device')} vs transformers {transformers.__version__} f64 on {dev}: "
          f"rel error {rel:.3e}, max |diff| {max_abs:.3e} -> {'PASS' if ok else 'FAIL'} (tol {args.tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
