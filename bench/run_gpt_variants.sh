#!/usr/bin/env bash
# GPT-2 steps in process (bench/gpt_train_bench) under several settings, one JSON line each, for
# A/B timings on the GPU machine (scripts/device_run.sh gptvariants). A variant is
# name=SETTINGS, SETTINGS comma-separated: ENV=value for the process, or --flag[=value] for
# gpt_train_bench; configs are batch:accumulation[:precision].
#
#   GPT_VARIANTS="det=--deterministic,MPTRAIN_STEP_GRAPHS=0 fast=MPTRAIN_STEP_GRAPHS=0" \
#   GPT_VARIANT_CONFIGS="16:4 32:2:fp16" bash bench/run_gpt_variants.sh
set -uo pipefail
OUT=${OUT:-/tmp/mptrain-out}
mkdir -p "$OUT"
: "${MPTRAIN_BIN:?source device_bundle/env.sh first}"
status=0
for config in ${GPT_VARIANT_CONFIGS:-16:4 32:2}; do
  IFS=: read -r batch accum precision <<<"$config"
  for variant in ${GPT_VARIANTS:-det=--deterministic fast=}; do
    name=${variant%%=*}
    settings=${variant#*=}
    envs=()
    flags=()
    IFS=, read -ra parts <<<"$settings"
    for part in "${parts[@]}"; do
      case "$part" in
        --*) flags+=("$part") ;;
        *=*) envs+=("$part") ;;
      esac
    done
    echo -n "$name $batch x $accum ${precision:-bf16}: "
    env "${envs[@]}" timeout 240 "$MPTRAIN_BIN/gpt_train_bench" --batch="$batch" --accum="$accum" \
      --precision="${precision:-bf16}" --warmup="${GPT_VARIANT_WARMUP:-3}" \
      --steps="${GPT_VARIANT_STEPS:-8}" ${GPT_VARIANT_FLAGS:-} "${flags[@]}" \
      2>>"$OUT/gpt_variants.err" | tee -a "$OUT/gpt_variants.jsonl" || { echo "FAILED"; status=1; }
  done
done
exit $status
