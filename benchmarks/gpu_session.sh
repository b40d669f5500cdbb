#!/usr/bin/env bash
# The long-context GPU numbers in one call on a lent GPU machine (a session has 15 minutes of device
# time, the machine's start included, and at most 10 minutes a call), written so that no row is lost.
#
# On the CPU machine first, from the project's root:
#   bash ../shared/gpu/prepare.sh     # builds .gpu/ (git-ignored: carry it): model config, tokenizer,
#                                     # WikiText, wheels
# then one device call, from the project's root:
#   bash benchmarks/gpu_session.sh    # rows in $OUT/rows.jsonl, logs in $OUT/<step>.log
# and the same plumbing on a CPU machine, in about a minute (a tiny Llama shape, short lengths):
#   SHAPE=tiny DEVICE=cpu bash benchmarks/gpu_session.sh
#
# Every measurement is one JSON line appended to $OUT/rows.jsonl (flushed and fsynced) the moment it
# is measured, and echoed on stdout; each step runs in one process that loads its model once, under
# its own `timeout`, so a step killed by its limit keeps every row it had written (benchmarks/rowfile.py).
# In each longctx step every mode is warmed at the measured length under bfloat16 autocast, then timed
# as the best of 3 (`times_s` all three, `wall_s` the best; `cuda_peak_mb` on CUDA); a mode that fails
# (out of GPU memory) gives a `failed` row and the step goes on. The steps, in order:
#   pip        the carried wheels ($G/whl) installed; pip's output in $OUT/pip.log
#   weights-1b the seeded Llama-3.2-1B-shape weights (float32, 4.3 GB, ~15 s) by .gpu/make_weights.py
#   1b         benchmarks/longctx.py --jsonl: sdpa and the one-pass kernel (--attention-dtype bfloat16:
#              q, k, v rounded to bfloat16 as sdpa multiplies them) at 4k, 32k, 128k tokens
#   weights-8b the Llama-3.1-8B shape by the same make_weights.py, built in bfloat16 (16 GB; float32 would
#              be 32 GB to write and read back, over a minute of the call, for weights autocast rounds
#              to bfloat16 anyway)
#   8b         the same two modes at 32k and 128k
#   press      benchmarks/press.py --jsonl: the atlas's press at 8k (the sweep's calibration and rows,
#              torch against fused), beside the model's own sdpa forward, on the 1B shape
# Limits (seconds): 30 + 30 + 90 + 60 + 90 + 40 = 5 min 40 s at most, ~7.5 min with the machine's start.
# A step that finds its weights already made is skipped. Environment (defaults for SHAPE=1b / tiny):
#   OUT (/tmp/attnscope-gpu), GPU_DIR (.gpu), DEVICE (cuda), SHAPE (1b; tiny: both parts on a 2-layer
#   Llama, 1B float32 and 8B bfloat16 weights alike), LENGTHS ("4096 32768 131072" / "256 512"),
#   LENGTHS_8B ("32768 131072" / "256 1024"), MODES ("sdpa streaming-onepass"; on the CPU also
#   "streaming", the compiled CPU kernel, and onepass gives a `skipped` row unless TRITON_INTERPRET=1:
#   the interpreter takes ~15 s a run at 256 tokens), PRESS_LENGTH (8192 / 256), PRESS_TASKS (2 / 1),
#   PRESS_ROWS (32 / 4), REPEAT (3), T_PIP T_W1 T_1B T_W8 T_8B T_PRESS (the limits above).
set -u
R=$(cd "$(dirname "$0")/.." && pwd)
fail() { echo "gpu_session.sh: error: $1" >&2; exit 2; }
OUT=${OUT:-/tmp/attnscope-gpu} G=${GPU_DIR:-$R/.gpu} DEVICE=${DEVICE:-cuda} SHAPE=${SHAPE:-1b}
case $DEVICE in cuda | cpu) ;; *) fail "DEVICE must be cuda or cpu, not '$DEVICE'" ;; esac
case $SHAPE in
  1b) W1=$G/llama1b S1=1b W8=$G/llama8b-bf16 S8=8b
      : "${LENGTHS:=4096 32768 131072}" "${LENGTHS_8B:=32768 131072}" "${PRESS_LENGTH:=8192}" "${PRESS_TASKS:=2}" "${PRESS_ROWS:=32}" ;;
  tiny) W1=$G/llamatiny S1=tiny W8=$G/llamatiny-bf16 S8=tiny
      : "${LENGTHS:=256 512}" "${LENGTHS_8B:=256 1024}" "${PRESS_LENGTH:=256}" "${PRESS_TASKS:=1}" "${PRESS_ROWS:=4}" ;;
  *) fail "SHAPE must be 1b or tiny, not '$SHAPE'" ;;
esac
[ "$DEVICE" = cuda ] && : "${MODES:=sdpa streaming-onepass}" || : "${MODES:=sdpa streaming-onepass streaming}"
[ -f "$G/make_weights.py" ] && [ -f "$G/llama1b/config.json" ] \
  || fail "no $G/make_weights.py and $G/llama1b/: run bash ../shared/gpu/prepare.sh first (or set GPU_DIR)"
mkdir -p "$OUT" || fail "cannot make OUT=$OUT"
ROWS=$OUT/rows.jsonl
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH=$R/src

nrows() { if [ -f "$ROWS" ]; then wc -l < "$ROWS"; else echo 0; fi; }
step() {  # name, seconds, command...: its output in $OUT/<name>.log, its rows on stdout as they come
  local name=$1 limit=$2 t0=$SECONDS n0 rc
  shift 2
  n0=$(nrows)
  echo "== $name (limit $limit s)"
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | grep --line-buffered -E '^\{|Error|B parameters'
  rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc$( [ "$rc" = 124 ] && echo ' (stopped by its time limit)') after $((SECONDS - t0)) s, $(($(nrows) - n0)) rows"
}
# make_weights.py builds the model in torch's default dtype: set here, so it writes bfloat16 weights when
# asked; written to <folder>.part and renamed, so a killed step leaves no half-written model behind
MAKE='import os, runpy, shutil, sys, torch
g, shape, out, dtype = sys.argv[1:]
torch.set_default_dtype(getattr(torch, dtype))
shutil.rmtree(out + ".part", ignore_errors=True)
sys.argv = ["make_weights.py", g + "/llama1b", "--shape", shape, "--out", out + ".part"]
runpy.run_path(g + "/make_weights.py", run_name="__main__")
os.replace(out + ".part", out)'
weights() {  # name, limit, shape, folder, dtype
  if [ -f "$4/config.json" ] && ls "$4"/*.safetensors > /dev/null 2>&1; then echo "== $1: made before, $4"
  else step "$1" "$2" python3 -c "$MAKE" "$G" "$3" "$4" "$5"; fi
}

echo "== $(date -u +%FT%TZ) SHAPE=$SHAPE DEVICE=$DEVICE, rows to $ROWS"
if [ "$DEVICE" = cuda ]; then nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; fi
if ls "$G"/whl/*.whl > /dev/null 2>&1; then
  timeout "${T_PIP:-30}" python3 -m pip install --no-index --no-deps --no-compile --no-cache-dir "$G"/whl/*.whl \
    > "$OUT/pip.log" 2>&1 && echo "== pip: the carried wheels installed ($OUT/pip.log)" \
    || echo "== pip: installing the carried wheels failed: see $OUT/pip.log"
else
  echo "== pip: no wheels in $G/whl, nothing installed"
fi
# the benchmarks read WikiText from ../shared beside the checkout: on the GPU machine, the copy in .gpu
if [ -f "$G/shared/data/wikitext-2/valid.sentences.txt" ] && mkdir -p "$R/../shared/data/wikitext-2" 2> /dev/null; then
  cp -n "$G/shared/data/wikitext-2/valid.sentences.txt" "$R/../shared/data/wikitext-2/" 2> /dev/null
fi

longctx() {  # name, limit, weights, lengths
  # shellcheck disable=SC2086 # the lengths and modes are lists
  step "$1" "$2" python3 "$R/benchmarks/longctx.py" --jsonl "$ROWS" --device "$DEVICE" --model "$3" \
    --dtype bfloat16 --attention-dtype bfloat16 --repeat "${REPEAT:-3}" --lengths $4 --modes $MODES
}
weights weights-1b "${T_W1:-30}" "$S1" "$W1" float32
longctx 1b "${T_1B:-90}" "$W1" "$LENGTHS"
weights weights-8b "${T_W8:-60}" "$S8" "$W8" bfloat16
longctx 8b "${T_8B:-90}" "$W8" "$LENGTHS_8B"
step press "${T_PRESS:-40}" python3 "$R/benchmarks/press.py" --jsonl "$ROWS" --model "$W1" --device "$DEVICE" \
  --dtype bfloat16 --length "$PRESS_LENGTH" --tasks "$PRESS_TASKS" --rows "$PRESS_ROWS"
echo "== done: $(nrows) rows in $ROWS"
