#!/usr/bin/env bash
# What runs on the GPU machine (device tool, 2 x H200): unpacks the bundle made by
# scripts/make_device_bundle.sh, runs the GPU tests, the README's main job on GPUs and the
# PyTorch comparison. Output goes to stdout and, in full, to $OUT (or /tmp/mptrain-out).
#
#   device: bash scripts/device_run.sh [tests] [gpt] [gptparity] [gptbench] [usage] [gptvariants] [attentionplans] [gptmemcheck] [gptprofile] [gptdiag] [gptexample] [example] [digits] [parity] [syncbn] [normbench] [bench] [net] [service] [scaling] [start] [fault] [load] [gemms] [profile] [ab] [overlap] [contention] [sweep] [trace] [hf]
set -uo pipefail
OUT=${OUT:-/tmp/mptrain-out}
mkdir -p "$OUT"
STEPS=${*:-tests example parity}
tar -C /tmp -xJf device_bundle.tar.xz
source /tmp/device_bundle/env.sh
nvidia-smi -L
missing=$(ldd "$MPTRAIN_BIN/worker" | grep "not found" || true)
if [ -n "$missing" ]; then echo "missing libraries: $missing"; exit 1; fi
status=0
for step in $STEPS; do
  echo "=== $step"
  case "$step" in
    tests)
      "$MPTRAIN_BIN/cuda_backend_test" --gtest_output="xml:$OUT/cuda_backend_test.xml" \
        >"$OUT/cuda_backend_test.log" 2>&1 || status=1
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|Expected|Which is|actual" \
        "$OUT/cuda_backend_test.log" | head -60
      # A test skipped that this machine could run fails the step; those needing more GPUs than
      # it has are listed (scripts/test_skips.py).
      gpus=$(nvidia-smi -L | grep -c '^GPU ')
      if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
        gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c '[^[:space:]]')
      fi
      python3 scripts/test_skips.py gpus "$gpus" "$OUT/cuda_backend_test.xml" || status=1 ;;
    gpt)
      # Issue 29: the GPT's CUDA primitives and training against the CPU backend.
      timeout 400 "$MPTRAIN_BIN/cuda_language_model_test" \
        --gtest_output="xml:$OUT/cuda_language_model_test.xml" \
        >"$OUT/cuda_language_model_test.log" 2>&1 || status=1
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|Expected|Which is|actual|error|dtype" \
        "$OUT/cuda_language_model_test.log" | head -60 ;;
    gptparity)
      # The GPT against PyTorch on CUDA (SDPA), fp32 / bf16 / fp16 + GradScaler with overflows.
      PYTHONUNBUFFERED=1 timeout 500 python3 parity/gpt_parity.py --device cuda --bin "$MPTRAIN_BIN" \
        --out "$OUT/gptparity" ${GPT_PARITY_CASES:+--cases "$GPT_PARITY_CASES"} \
        >"$OUT/gptparity.log" 2>&1 || status=1
      tail -12 "$OUT/gptparity.log" ;;
    gptbench)
      # GPT-2 through the service beside PyTorch eager and torch.compile (bench/run_gpt_bench.sh).
      PYTHONUNBUFFERED=1 timeout 590 bash bench/run_gpt_bench.sh >"$OUT/gptbench.log" 2>&1 || status=1
      tail -24 "$OUT/gptbench.log" ;;
    gptexample)
      # Issue 29: the byte-level GPT example on the GPU (run_example.sh --gpt --cuda), then GPT-2
      # 124M (examples/gpt2_124m_kjv.json: the full architecture, vocabulary 50257, on the KJV's
      # bytes) for 2000 steps through the service, telemetry every step: the loss falling.
      timeout 200 bash scripts/run_example.sh --gpt --cuda >"$OUT/gptexample.log" 2>&1 || status=1
      grep -E "run_example|SUCCEEDED|FAILED|eval_loss" "$OUT/gptexample.log" | tail -6
      COORDINATOR=$MPTRAIN_BIN/coordinator WORKER=$MPTRAIN_BIN/worker TRAINCTL=$MPTRAIN_BIN/trainctl
      (
        source scripts/lib/local_cluster.sh
        start_coordinator
        start_worker gpu0 0 --device=cuda --data_root=/tmp/mptrain-bible
        wait_for_workers 1 || exit 1
        job=$("$TRAINCTL" --coordinator="$ADDRESS" submit examples/gpt2_124m_kjv.json --wait | tail -1)
        "$TRAINCTL" --coordinator="$ADDRESS" status "$job" | tail -4
        "$TRAINCTL" --coordinator="$ADDRESS" export "$job" --format=jsonl >"$OUT/gpt2_124m_kjv.jsonl"
        stop_cluster
      ) >"$OUT/gpt2_124m.log" 2>&1 || status=1
      tail -5 "$OUT/gpt2_124m.log"
      python3 - "$OUT/gpt2_124m_kjv.jsonl" <<'PY' || status=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by_step = {int(r.get("step", 0)): r for r in rows}
for step in (1, 10, 100, 250, 500, 1000, 1500, 2000):
    r = by_step.get(step)
    if r:
        print(f"step {step:5d} loss {r.get('loss', 0):.4f} eval {r.get('evalLoss', r.get('eval_loss', '-'))}"
              f" ms {r.get('stepTimeMs', r.get('step_time_ms', 0)):.1f}")
print(f"telemetry records: {len(rows)}")
PY
      ;;
    gptdiag)
      # The GPT's GPU tests op by op (MPTRAIN_STEP_GRAPHS=0), then under compute-sanitizer's
      # memcheck (GPT_DIAG_FILTER, default the training parity cases).
      filter=${GPT_DIAG_FILTER:-*GptTrainingParity*}
      MPTRAIN_STEP_GRAPHS=0 timeout 200 "$MPTRAIN_BIN/cuda_language_model_test" --gtest_filter="$filter" \
        >"$OUT/gptdiag_nographs.log" 2>&1 || status=1
      grep -E "^\[  (PASSED|FAILED) |^\[==========\]|Failure|Which is|error" "$OUT/gptdiag_nographs.log" | head -20
      timeout 300 compute-sanitizer --tool memcheck --print-limit 4 \
        "$MPTRAIN_BIN/cuda_language_model_test" --gtest_filter="$filter" \
        >"$OUT/gptdiag_memcheck.log" 2>&1 || status=1
      grep -E "^\[  (PASSED|FAILED) |ERROR SUMMARY|Invalid|at 0x|by thread|Address|Saved host backtrace|#[0-9] " \
        "$OUT/gptdiag_memcheck.log" | head -40 ;;
    usage)
      # Issue 31: the worker's GPU readings through NVML on a real GPU (worker/device_usage).
      timeout 60 "$MPTRAIN_BIN/device_usage_test" >"$OUT/device_usage_test.log" 2>&1 || status=1
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|NVML|nvml|read" \
        "$OUT/device_usage_test.log" | head -20 ;;
    attentionplans)
      # Every cuDNN plan for the GPT's attention timed (bench/attention_plans.cc:
      # ATTENTION_SHAPES "B T H hs ...", ATTENTION_DTYPES), then PyTorch's SDPA backends.
      timeout 300 "$MPTRAIN_BIN/attention_plans" ${ATTENTION_SHAPES:-} \
        >"$OUT/attentionplans.log" 2>&1 || status=1
      timeout 200 python3 bench/torch_attention.py >>"$OUT/attentionplans.log" 2>&1 || status=1
      cat "$OUT/attentionplans.log" | head -150 ;;
    gptvariants)
      # GPT-2 in process under several settings (bench/run_gpt_variants.sh: GPT_VARIANTS,
      # GPT_VARIANT_CONFIGS).
      bash bench/run_gpt_variants.sh || status=1 ;;
    gptmemcheck)
      # A small GPT (2 blocks) trained with its steps recorded and replayed, under
      # compute-sanitizer's memcheck (GPT_MEMCHECK_FLAGS for more gpt_train_bench flags).
      MPTRAIN_STEP_GRAPHS=1 timeout 400 compute-sanitizer --tool memcheck --print-limit 4 \
        "$MPTRAIN_BIN/gpt_train_bench" --layers=2 --batch=4 --accum=2 --warmup=2 --steps=3 \
        ${GPT_MEMCHECK_FLAGS:-} >"$OUT/gptmemcheck.log" 2>&1 || status=1
      grep -E "ERROR SUMMARY|Invalid|at 0x|by thread|Address|engine|ms_per_step" \
        "$OUT/gptmemcheck.log" | head -30 ;;
    gptprofile)
      # Issue 29: the GPT step in process (bench/gpt_train_bench.cc), recorded as a CUDA graph and
      # op by op, then Nsight Compute over one steady op-by-op step, summed by kernel
      # (GPT_PROFILE_FLAGS: more gpt_train_bench flags, e.g. 350M's --layers=24 --width=1024
      # --heads=16, for both).
      # A gpt_train_bench_baseline in the bundle (make_device_bundle.sh BASELINE=<commit>) is
      # timed beside this tree's, alternating.
      builds=gpt_train_bench
      [ -x "$MPTRAIN_BIN/gpt_train_bench_baseline" ] && builds="gpt_train_bench_baseline gpt_train_bench"
      for config in ${GPT_PROFILE_CONFIGS:-16:4}; do
        IFS=: read -r batch accum <<<"$config"
        for build in $builds; do
          for graphs in ${GPT_PROFILE_GRAPHS:-1 0}; do
            echo -n "$build graphs=$graphs "
            MPTRAIN_STEP_GRAPHS=$graphs timeout 200 "$MPTRAIN_BIN/$build" --batch=$batch \
              --accum=$accum --precision=${GPT_PROFILE_PRECISION:-bf16} --warmup=3 --steps=6 \
              ${GPT_PROFILE_FLAGS:-} 2>>"$OUT/gpt_train_bench.err" | tee -a "$OUT/gpt_train_bench.jsonl" || status=1
          done
        done
      done
      # OnStep(p) comes as step p + kStatsSlots / 2 - 1 is issued (the stats ring, backend.h):
      # the range from OnStep(4) to OnStep(5) holds step 12's issue, of 18.
      MPTRAIN_STEP_GRAPHS=0 timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum \
        --csv --print-units base --profile-from-start off "$MPTRAIN_BIN/gpt_train_bench" \
        --batch=16 --accum=4 --precision=${GPT_PROFILE_PRECISION:-bf16} --warmup=2 --steps=16 \
        --profile_step=4 ${GPT_PROFILE_FLAGS:-} >"$OUT/gptprofile.csv" 2>"$OUT/gptprofile.err" || status=1
      tail -3 "$OUT/gptprofile.err"
      python3 bench/profile_report.py "$OUT/gptprofile.csv" | tee "$OUT/gptprofile.txt" | head -45 ;;
    example)
      timeout 300 bash scripts/run_example.sh >"$OUT/example.log" 2>&1 || status=1
      tail -25 "$OUT/example.log" ;;
    digits)
      # The second example (issue 13): the digits classifier on two GPUs, >= 97% test accuracy.
      timeout 300 bash scripts/run_example.sh --digits >"$OUT/digits.log" 2>&1 || status=1
      tail -12 "$OUT/digits.log" ;;
    hf)
      # Issues 28 and 29: transformers' GPT2LMHeadModel.from_pretrained on a GPT our service
      # trained on a CPU worker, then on a CUDA worker: its logits against
      # parity/gpt_reference.py's, its eval loss against our forward's (exit 77: no transformers).
      for device in cpu cuda; do
        PYTHONUNBUFFERED=1 timeout 240 python3 parity/hf_roundtrip.py --bin "$MPTRAIN_BIN" \
          --device "$device" --out "$OUT/hf" >"$OUT/hf_$device.log" 2>&1 || status=1
        tail -6 "$OUT/hf_$device.log"
      done ;;
    parity)
      # PARITY_CASES=a,b runs some of compare.py's cases only; PARITY_GPUS=1 on one GPU.
      PYTHONUNBUFFERED=1 timeout 400 python3 parity/compare.py --out "$OUT/parity" \
        ${PARITY_CASES:+--cases "$PARITY_CASES"} ${PARITY_GPUS:+--gpus "$PARITY_GPUS"} \
        >"$OUT/parity.log" 2>&1 || status=1
      tail -30 "$OUT/parity.log" ;;
    syncbn)
      # Issue 14: torch.nn.SyncBatchNorm + DDP + no_sync + GradScaler (fp16) against ours.
      PYTHONUNBUFFERED=1 timeout 500 python3 parity/sync_bn_compare.py --out "$OUT/syncbn" \
        >"$OUT/syncbn.log" 2>&1 || status=1
      tail -24 "$OUT/syncbn.log" ;;
    normbench)
      # The normalization layers' cost per step and small-collective latency, ours and PyTorch's.
      NORMS=${NORMS:-none batch_norm sync_batch_norm} CONFIGS=${NORM_CONFIGS:-seed,mlp1k} PYTHONUNBUFFERED=1 timeout 400 bash bench/run_norm_bench.sh \
        >"$OUT/normbench.log" 2>&1 || status=1
      tail -12 "$OUT/normbench.log" ;;
    bench)
      PYTHONUNBUFFERED=1 timeout 500 bash bench/run_bench.sh >"$OUT/bench.log" 2>&1 || status=1
      tail -22 "$OUT/bench.log" ;;
    net)
      # The two GPUs as two hosts over NCCL's socket transport, ours and PyTorch's.
      PYTHONUNBUFFERED=1 timeout 400 bash bench/run_net_bench.sh >"$OUT/net.log" 2>&1 || status=1
      tail -9 "$OUT/net.log"
      # Ours with one communicator (grad_comm_lanes 1), as PyTorch's process group has.
      LANES=1 TAG=lanes1 COMMS=fp32 CONFIGS=mlp8k PYTHONUNBUFFERED=1 timeout 200 \
        bash bench/run_net_bench.sh >"$OUT/net_lanes1.log" 2>&1 || status=1
      tail -4 "$OUT/net_lanes1.log"
      # NCCL's socket transport with more threads and sockets, for both engines alike.
      NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 TAG=4x4 COMMS=fp32 CONFIGS=mlp8k \
        PYTHONUNBUFFERED=1 timeout 200 bash bench/run_net_bench.sh >"$OUT/net_4x4.log" 2>&1 || status=1
      tail -4 "$OUT/net_4x4.log" ;;
    service)
      # Issue 16's measurement through the service (NVLink): trainctl-submitted jobs' telemetry
      # step times beside PyTorch DDP, fp32 gradients.
      TRANSPORT=nvlink COMMS=fp32 CONFIGS="${SERVICE_CONFIGS:-seed mlp1k mlp8k}" PYTHONUNBUFFERED=1 \
        timeout 300 bash bench/run_net_bench.sh >"$OUT/service.log" 2>&1 || status=1
      tail -6 "$OUT/service.log" ;;
    scaling)
      # Issue 17: 1, 2, 4, 8 GPUs (as many as are listed; GPUS="1 2" overrides), ours through the
      # service as one worker with N slots and as N one-slot workers, beside PyTorch DDP.
      PYTHONUNBUFFERED=1 timeout 580 bash bench/run_scaling_bench.sh >"$OUT/scaling.log" 2>&1 || status=1
      tail -32 "$OUT/scaling.log" ;;
    start)
      # Issues 16 and 33: submit to the end of a 5-step job, jobs 0, 0.5 and 3 s apart, with warm
      # rank processes reused for the next job, a new warm process per job, and none.
      PAUSES="${START_PAUSES:-0 0.5 3}" PYTHONUNBUFFERED=1 timeout 540 bash bench/run_start_bench.sh \
        >"$OUT/start.log" 2>&1 || status=1
      tail -13 "$OUT/start.log"
      # Where a back-to-back job's wait goes: the previous rank's teardown, the slot's release.
      grep -hE "released in|memory released|handed to" "$OUT"/start_bench_*_hostA.log 2>/dev/null |
        cut -c1-160 | tail -8 ;;
    fault)
      timeout 120 bash scripts/gpu_fault_demo.sh >"$OUT/fault.log" 2>&1 || status=1
      cat "$OUT/fault.log" ;;
    faultdiag)
      # The fault demo with every step issued op by op (MPTRAIN_STEP_GRAPHS=0), for comparison.
      MPTRAIN_STEP_GRAPHS=0 timeout 120 bash scripts/gpu_fault_demo.sh >"$OUT/fault_nographs.log" 2>&1 || status=1
      cat "$OUT/fault_nographs.log" ;;
    gemms)
      # Every cuBLASLt algorithm for mlp8k's GEMMs (bit-equal to the first choice or not), and
      # PyTorch's time for the same GEMMs, one GPU.
      for dtype in ${GEMM_DTYPES:-f16}; do
        timeout 200 "$MPTRAIN_BIN/gemm_algos" --dtype=$dtype --algos=${GEMM_ALGOS:-12} --iters=${GEMM_ITERS:-10} >"$OUT/gemms_$dtype.log" 2>&1 || status=1
        cat "$OUT/gemms_$dtype.log"
        timeout 100 python3 bench/torch_gemms.py --dtype=$dtype 2>&1 | tee "$OUT/torch_gemms_$dtype.log"
      done ;;
    sweep)
      # mlp8k in process on 1 and 2 GPUs, and on 2 GPUs under each setting in SWEEP (';'-separated
      # environment assignments; the empty one is the default).
      echo "gpus setting ms/step allreduce ms"
      IFS=';' read -ra settings <<<"${SWEEP:-;MPTRAIN_STEP_GRAPHS=0}"
      for gpus in ${SWEEP_GPUS:-1 2}; do
        for setting in "${settings[@]}"; do
          [ "$gpus" = 1 ] && [ -n "$setting" ] && [ -z "${SWEEP_GPUS:-}" ] && continue
          ms=$(env $setting timeout 120 "$MPTRAIN_BIN/train_bench" --gpus=$gpus --configs=${SWEEP_CONFIG:-mlp8k} \
            --warmup=10 --steps=${SWEEP_STEPS:-40} --raw_nccl=false 2>>"$OUT/sweep.err" | \
            python3 -c "import json,sys; r=json.loads(sys.stdin.readline()); print(round(r['step_ms'], 3), 'allreduce', round(r.get('allreduce_ms', 0), 3))")
          echo "$gpus ${setting:-default} $ms" | tee -a "$OUT/sweep.log"
        done
      done ;;
    ab)
      # This tree's train_bench against a baseline build carried as bin/train_bench_baseline
      # (scripts/make_device_bundle.sh BASELINE=<commit>), alternating, AB_ROUNDS times, on
      # AB_GPUS GPUs: the in-process step time of AB_CONFIG before and after a change.
      echo "round build ms/step"
      for round in $(seq ${AB_ROUNDS:-3}); do
        for build in baseline current; do
          binary="$MPTRAIN_BIN/train_bench"
          [ "$build" = baseline ] && binary="$MPTRAIN_BIN/train_bench_baseline"
          ms=$(timeout 120 "$binary" --gpus=${AB_GPUS:-1} --configs=${AB_CONFIG:-mlp8k} \
            --warmup=10 --steps=${AB_STEPS:-40} --raw_nccl=false 2>>"$OUT/ab.err" | \
            python3 -c "import json,sys; print(round(json.loads(sys.stdin.readline())['step_ms'], 3))")
          echo "$round $build $ms" | tee -a "$OUT/ab.log"
        done
      done ;;
    contention)
      # A collective's resident blocks beside mlp8k's backward GEMMs, with and without the GEMMs'
      # SM count target (bench/gemm_contention.cc), one GPU.
      timeout 200 "$MPTRAIN_BIN/gemm_contention" --ctas=${CONTENTION_CTAS:-8,16,32} \
        2>&1 | tee "$OUT/contention.log" ;;
    overlap)
      # Whether memory-bound work hides behind mlp8k's GEMMs on one GPU (PyTorch, two streams).
      timeout 120 python3 bench/overlap_probe.py 2>&1 | tee "$OUT/overlap.log" ;;
    trace)
      # Where mlp8k's step goes while it runs (bench/kernel_trace.cc: CUPTI, concurrent kernels),
      # in process on 1 and 2 GPUs.
      CUPTI=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu -name 'libcupti.so*' 2>/dev/null | head -1)
      g++ -O2 -shared -fPIC -std=c++17 -I/usr/local/cuda/include bench/kernel_trace.cc "$CUPTI" \
        -o /tmp/libkernel_trace.so || status=1
      for gpus in ${TRACE_GPUS:-1 2}; do
        rm -f "$OUT/trace_$gpus.txt"
        KERNEL_TRACE_OUT="$OUT/trace_$gpus.txt" LD_LIBRARY_PATH="$(dirname "$CUPTI"):$LD_LIBRARY_PATH" \
          LD_PRELOAD=/tmp/libkernel_trace.so timeout 200 "$MPTRAIN_BIN/train_bench" --gpus=$gpus \
          --configs=${TRACE_CONFIG:-mlp8k} --warmup=5 --steps=30 --allreduce_iters=0 --raw_nccl=false \
          2>>"$OUT/trace.err" | cut -c1-120
        head -30 "$OUT/trace_$gpus.txt"
      done ;;
    profile)
      # Each kernel of two mlp8k steps on one GPU (Nsight Compute, clocks as they run), summed by
      # kernel name; the step's wall time beside it comes from train_bench without the profiler.
      MPTRAIN_STEP_GRAPHS=0 timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum \
        --csv --print-units base --launch-skip ${PROFILE_SKIP:-200} --launch-count ${PROFILE_COUNT:-120} \
        "$MPTRAIN_BIN/train_bench" --gpus=1 --configs=${PROFILE_CONFIG:-mlp8k} --warmup=4 --steps=2 \
        >"$OUT/profile.csv" 2>"$OUT/profile.err" || status=1
      tail -3 "$OUT/profile.err"
      python3 bench/profile_report.py "$OUT/profile.csv" | tee "$OUT/profile.txt" ;;
  esac
done
exit $status
