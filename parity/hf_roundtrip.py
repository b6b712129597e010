"""Hugging Face's own loader against what our service wrote (issue 28): a GPT job's
output_checkpoint directory (model.safetensors + the config.json that trainer/hf_config.cc
writes beside it) is loaded with transformers' GPT2LMHeadModel.from_pretrained(dir), and its
logits on a few token sequences are compared with parity/gpt_reference.py's model loaded from the
same safetensors file (load_hf_tensors: Conv1D matrices transposed, wte's V rows).

  python3 parity/hf_roundtrip.py --checkpoint DIR [--spec F] # a directory our service wrote
  python3 parity/hf_roundtrip.py --bin BIN --out DIR [--device cpu|cuda]
                          # first trains a tiny GPT through a coordinator and a CPU worker of BIN
                          # (cuda: a CUDA worker, gpt_parity.py's GPU shape, cuDNN attention)

Checks: config.json's GPT2Config fields are gpt_reference.hf_config()'s for the shape the
checkpoint's tensors have (and, with the job's spec, its n_head); from_pretrained reports no unexpected or size-mismatched tensor and
no missing one besides the tied lm_head.weight and the attention-mask buffers; the head is wte
(tied); on each sequence (lengths 1, T/2 and T, ids in [0, V)) every position's logits agree
with the reference's first V within LOGIT_TOL relative to the largest logit (both fp32; HF's
attention masks with finfo.min and sums in another order), and differ between positions (a
vacuous comparison is no proof). With --bin, also against our own forward: the job evaluates
after its last step, and transformers' mean cross-entropy over the same evaluation batches (the
checkpoint's parameters are that step's) must be our reported eval_loss within EVAL_LOSS_TOL.

Exit 0: every check passed; 1: a check failed; 77: transformers (or torch) is not installed
here (Debian has no transformers package: the GPU machine has it, `scripts/device_run.sh hf`).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

LOGIT_TOL = 1e-4
# Relative: our fp32 forward (CPU or CUDA: cuBLASLt, our kernels) against transformers' on the
# CPU, both fp32, the loss a mean over every evaluation position (gpt_parity.py's fp32 loss
# tolerance).
EVAL_LOSS_TOL = 1e-5
MISSING_OK_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # Causal-mask buffers, not weights.
STAMP_KEYS = ("mptrain_job", "mptrain_owner")


def check_config(hf, tensors, ref):
    """config.json (a dict) against the checkpoint's tensors; returns (problems, GptConfig)."""
    problems = []
    wte = tensors["transformer.wte.weight"].shape
    layers = sum(1 for n in tensors if n.startswith("transformer.h.") and n.endswith(".ln_1.weight"))
    heads = hf.get("n_head")
    if not isinstance(heads, int) or heads <= 0 or wte[1] % heads:
        return [f"n_head {heads!r} does not divide n_embd {wte[1]}"], None
    config = ref.GptConfig(wte[0], tensors["transformer.wpe.weight"].shape[0], layers, heads,
                           wte[1], hf.get("mptrain_padded_vocab_size", 0))
    expected = ref.hf_config(config)
    for key, value in expected.items():
        if key not in hf:
            problems.append(f"config.json has no {key}")
        elif hf[key] != value:
            problems.append(f"config.json {key} is {hf[key]!r}, the checkpoint needs {value!r}")
    extra = sorted(set(hf) - set(expected) - set(STAMP_KEYS))
    if extra:
        problems.append(f"config.json has fields the reference does not write: {extra[:8]}")
    return problems, config


def check_against_spec(hf, spec, ref):
    """config.json against the JobSpec (a dict) that wrote it: n_head is in no tensor's shape."""
    wanted = ref.hf_config(ref.GptConfig.from_spec(spec["model"]["gpt"]))
    problems = [f"config.json {k} is {hf.get(k)!r}, the spec says {v!r}"
                for k, v in wanted.items() if hf.get(k) != v]
    if not hf.get("mptrain_job"):
        problems.append("config.json carries no mptrain_job stamp")
    return problems


def compare_logits(ours, theirs, tol=LOGIT_TOL):
    """Two [positions, V] float arrays; returns (problems, worst relative difference)."""
    import numpy as np
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    if ours.shape != theirs.shape:
        return [f"logits shapes {ours.shape} vs {theirs.shape}"], float("inf")
    if not (np.isfinite(ours).all() and np.isfinite(theirs).all()):
        return ["non-finite logits"], float("inf")
    scale = max(float(np.abs(theirs).max()), 1e-30)
    worst = float(np.abs(ours - theirs).max()) / scale
    problems = [] if worst <= tol else [f"logits differ by {worst:.3g} (relative) > {tol}"]
    if ours.shape[0] > 1 and float(np.abs(theirs - theirs[:1]).max()) <= 1e-6 * scale:
        problems.append("the logits are the same at every position: no proof")
    return problems, worst


def train_tiny(bin_dir, out, device):
    """One tiny GPT job through our service (gpt_parity.py's first fp32 case of the device, fewer
    steps, evaluated after the last); returns (the directory holding its model.safetensors and
    config.json, the spec, our last step's eval_loss)."""
    import gpt_parity
    from common import Cluster
    case_dir = os.path.join(out, f"tiny_{device}")
    case = gpt_parity.GPU_CASES["gpt_gpu_fp32"] if device == "cuda" else gpt_parity.CASES["gpt_w1_fp32"]
    steps = 5
    spec = gpt_parity.write_case("hf_roundtrip", dict(case, steps=steps, eval_every=steps),
                                 case_dir)
    spec["device"] = device
    ours = os.path.join(case_dir, "ours")
    os.makedirs(ours, exist_ok=True)
    spec["output_checkpoint"] = os.path.join(ours, "model.safetensors")
    cluster = Cluster(bin_dir, case_dir, gpus=1 if device == "cuda" else 0, roots_dir=out,
                      cpu_workers=0 if device == "cuda" else 1)
    try:
        records, _ = cluster.run(spec, os.path.join(case_dir, "spec.json"))
    finally:
        cluster.close()
    if not records or records[-1]["step"] != steps or records[-1].get("eval_loss") is None:
        raise RuntimeError(f"the job's telemetry has no eval_loss at its last step {steps}: "
                           f"{records[-1:]}")
    return ours, spec, records[-1]["eval_loss"]


def eval_loss_of(model, spec, config, ref, torch):
    """transformers' mean cross-entropy over the job's evaluation batches (rank 0 of 1), on the
    real vocabulary's logits, as our evaluation computes it (gpt_reference.py's evaluate)."""
    B, T, V = spec["micro_batch_size"], config.context_length, config.vocab_size
    batches = ref.micro_batches(spec["eval_tokens"], B, T, 0, 1, spec.get("eval_batches", 20), V)
    total = 0.0
    with torch.no_grad():
        for x, y in batches:
            logits = model(x).logits[..., :V].double()
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1)).item()
    return total / len(batches)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="a directory with model.safetensors and config.json")
    parser.add_argument("--bin", help="coordinator, worker and trainctl: train a tiny GPT first")
    parser.add_argument("--out", help="with --bin: where its files go")
    parser.add_argument("--spec", help="with --checkpoint: the JobSpec JSON that wrote it")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="with --bin: the worker that trains it")
    args = parser.parse_args()
    if bool(args.checkpoint) == bool(args.bin) or (args.bin and not args.out):
        parser.error("give --checkpoint DIR, or --bin BIN --out DIR")
    try:
        import numpy as np
        import torch
    except ImportError as missing:
        print(f"torch or numpy not installed ({missing}): run with /usr/bin/python3 "
              "(scripts/setup.sh installs python3-torch)")
        return 77
    try:
        import transformers
    except ImportError:
        print("transformers not installed: this check runs where it is (the GPU machine: "
              "scripts/device_run.sh hf)")
        return 77
    import gpt_reference as ref

    ours_eval_loss = None
    if args.checkpoint:
        directory, spec = args.checkpoint, None
        if args.spec:
            with open(args.spec) as f:
                spec = json.load(f)
    else:
        directory, spec, ours_eval_loss = train_tiny(args.bin, os.path.abspath(args.out),
                                                     args.device)
    with open(os.path.join(directory, "config.json")) as f:
        hf = json.load(f)
    tensors = ref.read_hf_checkpoint(directory)
    problems, config = check_config(hf, tensors, ref)
    if spec is not None:
        problems += check_against_spec(hf, spec, ref)
    if config is None:
        print("FAIL: " + "; ".join(problems))
        return 1

    torch.manual_seed(0)
    model, info = transformers.GPT2LMHeadModel.from_pretrained(
        directory, output_loading_info=True)
    model = model.float().eval()
    missing = [k for k in info.get("missing_keys", [])
               if k != "lm_head.weight" and not k.endswith(MISSING_OK_SUFFIXES)]
    for kind, keys in (("missing", missing), ("unexpected", info.get("unexpected_keys", [])),
                       ("size-mismatched", info.get("mismatched_keys", []))):
        if keys:
            problems.append(f"from_pretrained: {kind} tensors {list(keys)[:6]}")
    wte = model.transformer.wte.weight
    if model.lm_head.weight.data_ptr() != wte.data_ptr():
        problems.append("lm_head.weight is not tied to transformer.wte.weight")
    # The loaded weights are the file's (a tensor initialised instead of loaded shows here).
    theirs_state = model.state_dict()
    for name, value in tensors.items():
        loaded = theirs_state[name].detach().float().cpu().numpy()
        if loaded.shape != value.shape or not np.array_equal(loaded, value):
            problems.append(f"{name}: transformers holds other values than the file")
            break

    reference = ref.Gpt(config)
    ref.load_hf_tensors(reference, tensors)
    reference.eval()
    rng = np.random.default_rng(28)
    T, V = config.context_length, config.vocab_size
    worst = 0.0
    for length in sorted({1, max(1, T // 2), T}):
        tokens = torch.as_tensor(rng.integers(0, V, (1, length)), dtype=torch.long)
        with torch.no_grad():
            ours = reference(tokens)[0, :, :V].float().numpy()
            theirs = model(tokens).logits[0].float().numpy()
        seq_problems, diff = compare_logits(theirs, ours)
        worst = max(worst, diff)
        problems += [f"length {length}: {p}" for p in seq_problems]
        print(f"length {length:>4}: max relative logit difference {diff:.3e}")
    if ours_eval_loss is not None:
        theirs_eval_loss = eval_loss_of(model, spec, config, ref, torch)
        eval_diff = abs(theirs_eval_loss - ours_eval_loss) / max(abs(theirs_eval_loss), 1e-30)
        print(f"eval loss: ours ({args.device}) {ours_eval_loss:.7f}, transformers "
              f"{theirs_eval_loss:.7f}: relative difference {eval_diff:.3e}")
        if not eval_diff <= EVAL_LOSS_TOL:
            problems.append(f"our eval_loss {ours_eval_loss} and transformers' "
                            f"{theirs_eval_loss} differ by {eval_diff:.3g} > {EVAL_LOSS_TOL}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; "
          f"V {V} (padded {config.padded_vocab_size}), T {T}, L {config.layers}, "
          f"H {config.heads}, C {config.width}; tolerance {LOGIT_TOL}")
    if problems:
        print("FAIL: " + "; ".join(problems[:8]))
        return 1
    print(f"ok: GPT2LMHeadModel.from_pretrained({directory}) matches the reference "
          f"(worst {worst:.3e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
