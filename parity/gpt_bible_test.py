"""The README's language-model example end to end: scripts/make_text_shards.py writes byte-level
shards of the KJV Bible, and examples/gpt_bible.json (a GPT of 2 layers, width 64, context 64,
600 AdamW steps of 8 sequences per rank on two CPU workers) must end with a validation loss
below MAX_EVAL_LOSS nats per byte (the unigram entropy of the bytes is 3.02; measured 2.085),
the same promise scripts/run_example.sh --gpt checks.

  python3 parity/gpt_bible_test.py --bin DIR --out DIR
"""
import argparse
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Cluster  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MAX_EVAL_LOSS = 2.3  # scripts/run_example.sh's GPT_MAX_EVAL_LOSS


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    data = os.path.join(out, "bible")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_text_shards.py"), data],
                   check=True)
    spec = json.load(open(os.path.join(ROOT, "examples", "gpt_bible.json")))
    # The example reads /tmp/mptrain-bible (what run_example.sh --gpt writes); here: data.
    for section in (spec["data"]["tokens"], spec["eval_tokens"]):
        section["files"] = [f.replace("/tmp/mptrain-bible", data) for f in section["files"]]
    cluster = Cluster(args.bin, out, gpus=0, roots_dir=out)
    try:
        steps, seconds = cluster.run(spec, os.path.join(out, "gpt_bible.json"))
    finally:
        cluster.close()
    evaluations = [(s["step"], s["eval_loss"]) for s in steps if s.get("eval_loss") is not None]
    print("step  eval loss (nats/byte, bits/byte)")
    for step, loss in evaluations:
        print(f"{step:>4}  {loss:.4f}  {loss / math.log(2):.4f}")
    final = evaluations[-1][1] if evaluations else math.inf
    print(f"final validation loss {final:.4f} nats/byte after {steps[-1]['step'] if steps else 0}"
          f" steps in {seconds:.1f} s (two CPU workers, submit to SUCCEEDED)")
    ok = bool(evaluations) and evaluations[-1][0] == spec["steps"] and final < MAX_EVAL_LOSS
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
