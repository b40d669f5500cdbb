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
# Each step has its own time limit, so a step that hangs costs only its share (together 8 min 50 s);
# each writes $OUT/<step>.log, and the two run.sh steps their rows to $OUT/<step>/longctx-gpu.json:
#   rounded   the Llama-3.2-1B shape in bfloat16 at 4k, 32k and 128k tokens: the bare sdpa forward
#             and the one-pass kernel on q, k, v rounded to bfloat16 as sdpa multiplies them
#             (--attention-dtype bfloat16: the tensor cores), wall time and CUDA peak memory
#             (../shared/gpu/run.sh installs the wheels and makes the seeded weights first)
#   float32   the same at 4k and 32k with float32 attention modules (the default): the engine as
#             it picks its backend on CUDA (flex) and the one-pass kernel
#   compare   flex against the one-pass kernel at 4k on the rounded q, k, v: the largest
#             difference of every statistic
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

mkdir -p "$OUT/rounded" "$OUT/float32"
step rounded 270 env OUT="$OUT/rounded" bash "$R/.gpu/run.sh" --lengths 4096 32768 131072 \
  --modes sdpa streaming-onepass --attention-dtype bfloat16 --timeout 60
step float32 120 env OUT="$OUT/float32" bash "$R/.gpu/run.sh" --lengths 4096 32768 \
  --modes sdpa streaming streaming-onepass --timeout 30
step compare 60 python3 "$R/benchmarks/longctx.py" --device cuda --model "$M" --dtype bfloat16 \
  --attention-dtype bfloat16 --lengths 4096 --compare flex onepass
step press 80 python3 "$R/benchmarks/press.py" --model "$M" --device cuda --dtype bfloat16 \
  --length 8192 --tasks 2 --rows 32
