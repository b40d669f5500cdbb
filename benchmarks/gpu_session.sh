#!/usr/bin/env bash
# Every GPU number issue 38 asks for, in one call on a lent GPU machine (a session has 15 minutes
# of device time, the machine's start included, and at most 10 minutes a call).
#
# On the CPU machine first, from the project's root:
#   bash ../shared/gpu/prepare.sh     # builds .gpu/ (git-ignored, it travels): model config,
#                                     # tokenizer, WikiText, wheels
# then one device call, from the project's root:
#   bash benchmarks/gpu_session.sh    # rows and logs under $OUT
#
# Each step has its own time limit, so a step that hangs costs only its share (together 9 min):
#   longctx   the Llama-3.2-1B shape in bfloat16 at 4k, 32k and 128k tokens: the bare sdpa forward,
#             the streaming engine as it picks its backend on CUDA (flex), and the one-pass kernel
#             (wall time and CUDA peak memory; ../shared/gpu/run.sh installs the wheels and makes
#             the seeded weights first)
#   compare   flex against the one-pass kernel at 4k: the largest difference of every statistic
#   press     the atlas's press at 8k: torch against fused, beside the model's own sdpa forward
set -u
R=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/attnscope-gpu}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH=$R/src
M=$R/.gpu/llama1b
[ -f "$R/.gpu/run.sh" ] || { echo "no .gpu/: run bash ../shared/gpu/prepare.sh on the CPU machine first"; exit 2; }

step() {  # name, seconds, command...: its output in $OUT/<name>.log, the rows that matter here
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0)) s"
  grep -E '^\{|x sdpa|difference|Error|error' "$OUT/$name.log" | tail -20
}

step longctx 330 bash "$R/.gpu/run.sh" --lengths 4096 32768 131072 \
  --modes sdpa streaming streaming-onepass --timeout 100
step compare 90 python3 "$R/benchmarks/longctx.py" --device cuda --model "$M" --dtype bfloat16 \
  --lengths 4096 --compare flex onepass
step press 120 python3 "$R/benchmarks/press.py" --model "$M" --device cuda --dtype bfloat16 \
  --length 8192 --tasks 2 --rows 32
