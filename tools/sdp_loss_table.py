#!/usr/bin/env python3
"""tools/sdp_loss_table.py — the SDP replication table of docs/performance.md ("SDP: validation
loss at equal compute"): trains one model on the fortunes corpus five ways under mpirun — plain
data parallelism, and SDP forward / backward masking at the neuron / block level at coverage C —
with the compute matched, and prints a Markdown table of validation loss against the fraction of
the budget spent, with the steps each run took.

FLOP matching. Every run has N workers with the same batch per worker. Per token, a worker's
training FLOPs are 2·(forward matmul parameters) for the forward, 2· for the input gradients and
2· for the weight gradients, plus the attention scores (Note [Model FLOPs] in
layers/transformer.h); the head and embeddings are replicated. With P_s the split parameters (the
blocks' MLP weights at the neuron level, the blocks at the block level) and P_r the rest:
  DP          6·(P_r + P_s) + A
  forward     6·(P_r + C·P_s) + A·(C at the block level, else 1)
  backward    4·(P_r + P_s) + 2·(P_r + C·P_s) + A   (the unheld weight-gradient GEMMs skipped)
A run gets round(S · DP / scheme) steps (S = --steps, DP's), its schedule stretched with it, and
is evaluated at the same fractions of the budget. The FLOPs are computed here from the config,
not measured.

Two losses per point: "workers" is what the run logs (the mean over the workers of their own
subnetworks' validation loss), "full" is the full model's, consolidated from the run's checkpoint
at that step and evaluated by one process (`train --eval` with the checkpoint as
model.init_from, on the same validation batches). Under DP and backward
masking every worker holds the full model, so the two agree; under forward masking the full
model (every unit or block, unscaled) is what SDP delivers.

Usage (after tools/quickstart.sh has built train and prepared datasets/fortunes):
  OMP_NUM_THREADS=1 python3 tools/sdp_loss_table.py --build build-quickstart --ranks 4 \\
      --steps 200 --coverage 0.5
Each run writes runs/sdp-study/<name>/; the table goes to stdout and runs/sdp-study/table.md.
"""
import argparse
import json
import os
import subprocess
import sys


def model_numbers(n_layer, n_embd, n_head, n_kv_head, vocab, seq_len, arch):
    """(P_mlp, P_block, P_rest, attention FLOPs per token) of the model, per token of T."""
    head_dim = n_embd // n_head
    if arch == "llama":
        h = 2 * 4 * n_embd // 3
        ffn = (h + 255) // 256 * 256  # ffn_multiple 256, layers/model_config.h
        mlp = 3 * n_embd * ffn
        attn = n_embd * (n_head + 2 * n_kv_head) * head_dim + n_embd * n_embd
        norms = 2 * n_embd
    else:
        ffn = 4 * n_embd
        mlp = 2 * n_embd * ffn + ffn + n_embd
        attn = 3 * n_embd * n_embd + 3 * n_embd + n_embd * n_embd + n_embd
        norms = 4 * n_embd
    block = mlp + attn + norms
    rest = vocab * n_embd  # the head's matmul (embedding lookups are not matmuls)
    attention = 12 * n_layer * n_embd * seq_len
    return mlp, block, rest, attention


def flops_per_token(scheme, coverage, numbers, n_layer):
    mlp, block, rest, attention = numbers
    full = rest + n_layer * block
    if scheme == "dp":
        return 6 * full + attention
    mode, level = scheme.split("-")
    split = n_layer * (mlp if level == "neuron" else block)
    owned = full - split + coverage * split
    if mode == "forward":
        return 6 * owned + attention * (coverage if level == "block" else 1.0)
    return 4 * full + 2 * owned + attention


def read_val(path):
    out = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "val/loss" in rec:
                out[rec["step"]] = rec["val/loss"]
    return out


def full_loss(args, out_dir, step):
    """The full model's validation loss from the run's checkpoint at `step`, by one process."""
    ckpt = os.path.join(out_dir, "checkpoints", f"step_{step:08d}") if step else ""
    if not os.path.isdir(ckpt):
        return None
    cmd = [os.path.join(args.build, "bin", "train"), "--config", args.config, "--eval"]
    sets = [f"model.init_from={ckpt}", f"data.batch_size={args.batch}", "train.val_steps=20",
            f"train.out_dir={os.path.join(out_dir, 'full_eval')}"]
    if args.seed:
        sets.append(f"data.seed={args.seed}")  # the run's validation batches
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(out.strip().split("val loss ")[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-quickstart")
    ap.add_argument("--config", default="configs/llama-tiny.yaml")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200, help="data parallelism's steps")
    ap.add_argument("--points", type=int, default=4, help="evaluations over the budget")
    ap.add_argument("--coverage", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=4, help="sequences per worker per step")
    ap.add_argument("--out", default="runs/sdp-study")
    ap.add_argument("--only", default="", help="comma-separated schemes to run (default: all)")
    ap.add_argument("--reuse", action="store_true",
                    help="skip a run whose metrics.jsonl exists (re-evaluate its checkpoints)")
    ap.add_argument("--seed", type=int, default=0,
                    help="train.seed and data.seed (weights, batch order); 0: the config's")
    args = ap.parse_args()

    # The model of --config (the keys the FLOP formula needs), as the trainer reads it.
    import re
    text = open(args.config).read()

    def key(name, default):
        m = re.search(r"^\s*" + name + r":\s*([^\s#]+)", text, re.M)
        return type(default)(m.group(1)) if m else default

    arch = key("arch", "gpt2")
    n_layer, n_embd, n_head = key("n_layer", 4), key("n_embd", 128), key("n_head", 4)
    n_kv_head = key("n_kv_head", n_head)
    vocab, seq_len = key("vocab_size", 50257), key("seq_len", 64)
    numbers = model_numbers(n_layer, n_embd, n_head, n_kv_head, vocab, seq_len, arch)
    schemes = ["dp", "forward-neuron", "backward-neuron", "forward-block", "backward-block"]
    if args.only:
        schemes = [s for s in schemes if s in args.only.split(",")]
    dp_flops = flops_per_token("dp", 1.0, numbers, n_layer)
    rows = {}
    for scheme in schemes:
        f = flops_per_token(scheme, args.coverage, numbers, n_layer)
        steps = round(args.steps * dp_flops / f)
        every = [round(steps * (i + 1) / args.points) for i in range(args.points)]
        out_dir = os.path.join(args.out, scheme)
        sets = [
            f"parallel.dp={args.ranks}", f"data.batch_size={args.batch}", f"train.steps={steps}",
            f"train.val_every={every[0]}", "train.val_steps=20", "train.sample_every=0",
            "train.log_every=50", f"checkpoint.every={every[0]}", "checkpoint.keep=0",
            "checkpoint.at_end=true", "checkpoint.async=false",
            f"train.out_dir={out_dir}", "logging.tensorboard=false",
            f"optim.warmup_steps={max(1, steps // 10)}",
        ]
        if args.seed:
            sets += [f"train.seed={args.seed}", f"data.seed={args.seed}"]
        if scheme != "dp":
            mode, level = scheme.split("-")
            sets += [f"parallel.sdp.mode={mode}", f"parallel.sdp.level={level}",
                     f"parallel.sdp.coverage={args.coverage}"]
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.ranks),
               "-x", "OMP_NUM_THREADS", os.path.join(args.build, "bin", "train"), "--config",
               args.config]
        for s in sets:
            cmd += ["--set", s]
        print(f"{scheme}: {steps} steps, {f / 1e6:.2f} MFLOP/token (dp {dp_flops / 1e6:.2f})",
              file=sys.stderr)
        print(" ".join(cmd), file=sys.stderr)
        if not (args.reuse and os.path.exists(os.path.join(out_dir, "metrics.jsonl"))):
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        val = read_val(os.path.join(out_dir, "metrics.jsonl"))
        # val_every = every[0] evaluates at its multiples; take the one nearest each point.
        got = []
        for target in every:
            step = min(val, key=lambda s: abs(s - target)) if val else None
            got.append((step, val.get(step), full_loss(args, out_dir, step)))
        rows[scheme] = (steps, f, got)

    lines = [f"| budget | " + " | ".join(rows) + " |",
             "| --- |" + " --- |" * len(rows)]
    lines.append("| MFLOP/token (per worker) | " +
                 " | ".join(f"{rows[s][1] / 1e6:.2f}" for s in rows) + " |")
    lines.append("| steps | " + " | ".join(str(rows[s][0]) for s in rows) + " |")
    for i in range(args.points):
        cells = []
        for s in rows:
            step, v, full = rows[s][2][i]
            w = f"{v:.4f}" if v is not None else "—"
            fl = f"{full:.4f}" if full is not None else "—"
            cells.append(f"{fl} / {w} (step {step})")
        lines.append(f"| {100 * (i + 1) // args.points}% | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Each cell: the full model's validation loss / the workers' mean (step).")
    table = "\n".join(lines)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
