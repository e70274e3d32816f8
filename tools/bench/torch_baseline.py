#!/usr/bin/env python3
"""tools/bench/torch_baseline.py — the PyTorch side of Loom's GPU comparison (issue 27).

Trains the model of a Loom config (configs/*.yaml: GPT-2 or Llama) in PyTorch with the
transformers implementation, as a PyTorch user would run it: float32 master weights under bf16
autocast, `scaled_dot_product_attention` (attn_implementation="sdpa"), fused AdamW, the same
batch and sequence length, random tokens; eagerly or under `torch.compile`. Prints one line

    torch_baseline: MODEL MODE B=.. T=.. tok/s X MFU Y% peak mem Z GiB (compile+warmup S s)

with MFU counted exactly as Loom counts it (layers/transformer.cpp Transformer::flops_per_token:
6·N + 12·L·C·T per token, N the parameters without GPT-2's position table, the vocabulary
padded as Loom pads it: model.vocab_multiple) over --peak-flops, the measured GEMM rate
that tools/gpu_check.sh passes to Loom too, so the two MFUs are directly comparable.

    python3 tools/bench/torch_baseline.py --config configs/gpt2-124m.yaml --batch 32 --seq 1024 \
        [--steps 10] [--warmup 3] [--compile] [--peak-flops 7.9e14] [--device cuda]
"""
import argparse
import sys
import time


def padded_vocab(m):
    # As layers/model_config.h: the tables padded to model.vocab_multiple (default 128).
    v, k = int(m["vocab_size"]), int(m.get("vocab_multiple", 128))
    return (v + k - 1) // k * k


def ffn_hidden(m, C):
    # As ModelConfig::ffn_hidden_size(): given, else 2/3 of 4·C rounded up to ffn_multiple.
    if int(m.get("ffn_hidden", 0)) > 0:
        return int(m["ffn_hidden"])
    k = int(m.get("ffn_multiple", 256))
    return (2 * 4 * C // 3 + k - 1) // k * k


def build(model_cfg, transformers):
    arch = model_cfg.get("arch", "gpt2")
    L, H, C = int(model_cfg["n_layer"]), int(model_cfg["n_head"]), int(model_cfg["n_embd"])
    V = padded_vocab(model_cfg)
    T = int(model_cfg.get("max_seq_len", 1024))
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=V, n_positions=T, n_embd=C, n_layer=L, n_head=H,
                                      activation_function="gelu_new", resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0)
        cfg._attn_implementation = "sdpa"
        return transformers.GPT2LMHeadModel(cfg), arch, L, C, V, T
    if arch == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=V, hidden_size=C, intermediate_size=ffn_hidden(model_cfg, C),
            num_hidden_layers=L, num_attention_heads=H,
            num_key_value_heads=int(model_cfg.get("n_kv_head", H)), max_position_embeddings=T,
            rope_theta=float(model_cfg.get("rope_theta", 10000.0)),
            tie_word_embeddings=bool(model_cfg.get("tie_embeddings", True)))
        cfg._attn_implementation = "sdpa"
        return transformers.LlamaForCausalLM(cfg), arch, L, C, V, T
    sys.exit(f"torch_baseline: model.arch '{arch}' is not a GPT-2 or Llama config")


def flops_per_token(model, arch, L, C, V, T_pos, T):
    # Every distinct parameter (a tied table once), without GPT-2's position table and, when the
    # head is untied, without the input table (a lookup, not a matmul).
    n = sum(p.numel() for p in model.parameters())
    if arch == "gpt2":
        n -= T_pos * C
    if not model.config.tie_word_embeddings:
        n -= V * C
    return 6.0 * n + 12.0 * L * C * T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--peak-flops", type=float, default=0.0)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    import torch
    import transformers
    import yaml

    with open(a.config) as f:
        model_cfg = yaml.safe_load(f)["model"]
    torch.manual_seed(0)
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model, arch, L, C, V, T_pos = build(model_cfg, transformers)
    model.to(dev).train()
    fpt = flops_per_token(model, arch, L, C, V, T_pos, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1,
                            fused=dev.type == "cuda")
    step_model = torch.compile(model) if a.compile else model
    vocab = int(model_cfg["vocab_size"])

    def batch():
        x = torch.randint(0, vocab, (a.batch, a.seq + 1), device=dev)
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()

    def step(ids, targets):
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            logits = step_model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                 targets.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    batches = [batch() for _ in range(4)]
    t0 = time.time()
    for i in range(a.warmup):
        step(*batches[i % len(batches)])
    sync()
    warm_s = time.time() - t0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(a.steps):
        t = time.time()
        loss = step(*batches[i % len(batches)])
        sync()
        times.append(time.time() - t)
    times.sort()
    dt = times[len(times) // 2]
    tok_s = a.batch * a.seq / dt
    mfu = 100.0 * fpt * tok_s / a.peak_flops if a.peak_flops > 0 else float("nan")
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else float("nan")
    name = a.config.rsplit("/", 1)[-1].removesuffix(".yaml")
    print(f"torch_baseline: {name} {'compile' if a.compile else 'eager'} B={a.batch} T={a.seq} "
          f"tok/s {tok_s:.0f} MFU {mfu:.1f}% peak mem {peak:.2f} GiB (compile+warmup {warm_s:.1f} s, "
          f"median of {a.steps} steps, loss {loss.item():.3f}, torch {torch.__version__})", flush=True)


if __name__ == "__main__":
    main()
