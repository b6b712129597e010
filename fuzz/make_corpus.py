#!/usr/bin/env python3
"""Writes the seed corpora of the fuzzers (fuzz/corpus/<harness>/): a few small valid and
near-valid inputs each. Deterministic; rerun it after changing a format, then commit the files.

    python3 fuzz/make_corpus.py
"""

import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
EXAMPLES = os.path.join(HERE, "..", "examples")


def write(harness, name, data):
    directory = os.path.join(CORPUS, harness)
    os.makedirs(directory, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


# ---- job specs ----

def job_spec_corpus():
    for name in sorted(os.listdir(EXAMPLES)):
        if name.endswith(".json"):
            with open(os.path.join(EXAMPLES, name), "rb") as f:
                write("job_spec_fuzzer", name, f.read())
    minimal = {
        "name": "m", "world_size": 1, "device": "cpu",
        "model": {"input_dim": 4, "output_dim": 2},
        "data": {"synthetic": {"seed": 0}},
        "micro_batch_size": 2, "accumulation_steps": 1, "steps": 1,
        "optimizer": {"lr": 0.1},
    }
    write("job_spec_fuzzer", "minimal.json", json.dumps(minimal))
    full = dict(minimal, precision="bf16", max_restarts=2, queue_timeout_s=30,
                checkpoint_every=5, checkpoint_dir="/out/ckpt", progress_timeout_s=60,
                init_checkpoint="/data/init.safetensors", output_checkpoint="/out/final",
                model={"input_dim": 8, "hidden_dims": [16, 16], "output_dim": 1,
                       "activation": "GELU"},
                data={"npy": {"features_path": "/data/x.npy", "targets_path": "/data/y.npy"}},
                loss_scaler={"enabled": False})
    write("job_spec_fuzzer", "full.json", json.dumps(full))
    training = dict(minimal, loss="cross_entropy", label_smoothing=0.1, eval_every=10,
                    model={"input_dim": 8, "hidden_dims": [16], "output_dim": 4},
                    data={"npy": {"features_path": "/data/x.npy", "targets_path": "/data/y.npy",
                                  "shuffle": True, "shuffle_seed": 3}},
                    eval_data={"features_path": "/data/ex.npy", "targets_path": "/data/ey.npy"},
                    optimizer={"kind": "adamw", "lr": 0.01, "weight_decay": 0.01,
                               "beta2": 0.98},
                    lr_schedule={"kind": "warmup_cosine", "warmup_steps": 1, "min_lr": 0.001})
    write("job_spec_fuzzer", "training.json", json.dumps(training))
    gpt = dict(minimal, world_size=2,
               model={"gpt": {"vocab_size": 256, "context_length": 64, "layers": 2, "heads": 4,
                              "width": 32}},
               data={"tokens": {"files": ["/data/kjv/train_*.bin"], "shuffle": True}},
               eval_tokens={"files": ["/data/kjv/val_000.bin"]}, eval_batches=4, eval_every=5,
               sample={"prompt_text": "And God said", "max_new_tokens": 64, "top_k": 20})
    write("job_spec_fuzzer", "gpt.json", json.dumps(gpt))
    huge = dict(minimal, model={"input_dim": 1 << 20, "hidden_dims": [1 << 20, 1 << 20],
                                "output_dim": 1 << 20},
                micro_batch_size=1 << 20, accumulation_steps=1 << 16)
    write("job_spec_fuzzer", "huge.json", json.dumps(huge))
    write("job_spec_fuzzer", "zero_hidden.json",
          json.dumps(dict(minimal, model={"input_dim": 4, "hidden_dims": [0], "output_dim": 2})))
    write("job_spec_fuzzer", "unknown_field.json", json.dumps(dict(minimal, colour="red")))
    write("job_spec_fuzzer", "wrong_type.json", json.dumps(dict(minimal, world_size="two")))
    write("job_spec_fuzzer", "nan_lr.json",
          json.dumps(minimal).replace('"lr": 0.1', '"lr": "NaN"'))
    write("job_spec_fuzzer", "truncated.json", json.dumps(minimal)[:57])


# ---- .npy ----

def npy(descr, shape, data, version=(1, 0), fortran="False", extra=""):
    shape_text = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, %s}" % (
        descr, fortran, shape_text, extra)
    length_size = 2 if version[0] == 1 else 4
    total = 6 + 2 + length_size + len(header) + 1
    header += " " * ((64 - total % 64) % 64) + "\n"
    length = struct.pack("<H" if length_size == 2 else "<I", len(header))
    return b"\x93NUMPY" + bytes(version) + length + header.encode("latin-1") + data


def npy_corpus():
    floats = struct.pack("<6f", 0.5, -1.0, 2.0, 3.25, float("inf"), 0.0)
    write("npy_fuzzer", "matrix_v1", npy("<f4", (2, 3), floats))
    write("npy_fuzzer", "matrix_v2", npy("<f4", (3, 2), floats, version=(2, 0)))
    write("npy_fuzzer", "matrix_v3", npy("<f4", (1, 6), floats, version=(3, 0)))
    write("npy_fuzzer", "labels_i8", npy("<i8", (3,), struct.pack("<3q", 0, 7, -1)))
    write("npy_fuzzer", "labels_i4_column", npy("<i4", (4, 1), struct.pack("<4i", 1, 2, 3, 4)))
    write("npy_fuzzer", "truncated_data", npy("<f4", (2, 3), floats[:20]))
    write("npy_fuzzer", "fortran_order", npy("<f4", (2, 3), floats, fortran="True"))
    write("npy_fuzzer", "f8", npy("<f8", (1, 3), struct.pack("<3d", 1, 2, 3)))
    write("npy_fuzzer", "huge_shape", npy("<f4", (1 << 62, 1 << 62), floats))
    write("npy_fuzzer", "zero_dim", npy("<f4", (0, 3), b""))
    write("npy_fuzzer", "extra_key", npy("<f4", (2, 3), floats, extra="'x': 1, "))
    write("npy_fuzzer", "bad_magic", b"\x93NUMPZ" + npy("<f4", (2, 3), floats)[6:])
    # Long names and values that an error must not quote (fuzz/error_leak_check.h).
    write("npy_fuzzer", "long_key", npy("<f4", (2, 3), floats, extra="'a_long_unknown_key': 1, "))
    write("npy_fuzzer", "long_dtype", npy("<a_long_unknown_dtype", (2, 3), floats))


# ---- safetensors ----

def safetensors(entries, metadata=None, raw_header=None):
    """entries: [(name, dtype, shape, bytes)] laid out in order."""
    header, data = {}, b""
    for name, dtype, shape, payload in entries:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata is not None:
        header["__metadata__"] = metadata
    text = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":"))
    text = text.encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(*values):
    return struct.pack("<%df" % len(values), *values)


def safetensors_corpus():
    write("safetensors_fuzzer", "two_tensors",
          safetensors([("a", "F32", (2, 2), f32(1, 2, 3, 4)), ("b", "F32", (3,), f32(5, 6, 7))],
                      metadata={"format": "pt"}))
    write("safetensors_fuzzer", "empty_header", safetensors([]))
    write("safetensors_fuzzer", "scalar_and_empty",
          safetensors([("s", "F32", (), f32(1)), ("e", "F32", (0, 4), b"")]))
    write("safetensors_fuzzer", "nan", safetensors([("a", "F32", (2,), f32(float("nan"), 1))]))
    write("safetensors_fuzzer", "f16", safetensors([("a", "F16", (2,), b"\x00\x3c\x00\x40")]))
    write("safetensors_fuzzer", "overlap", safetensors([], raw_header=json.dumps({
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})) + f32(1, 2, 3))
    write("safetensors_fuzzer", "offsets_past_end", safetensors([], raw_header=json.dumps({
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})) + f32(1))
    write("safetensors_fuzzer", "negative_shape", safetensors([], raw_header=json.dumps({
        "a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})) + f32(1))
    write("safetensors_fuzzer", "header_too_long", struct.pack("<Q", 1 << 40) + b"{}")
    write("safetensors_fuzzer", "bad_metadata", safetensors(
        [("a", "F32", (1,), f32(1))], metadata={"step": 3}))
    # Bytes an error must not quote or spell as a number (fuzz/error_leak_check.h).
    write("safetensors_fuzzer", "shadow", b"root:*:20000:0:99999:7:::\n")
    write("safetensors_fuzzer", "long_name_f16",
          safetensors([("a_long_secret_tensor_name", "F16", (2,), b"\x00\x3c\x00\x40")]))


# ---- training checkpoints (layout: Linear 3 -> 2 -> 1) ----

CHECKPOINT_SHAPES = [("layers.0.weight", (2, 3)), ("layers.0.bias", (2,)),
                     ("layers.1.weight", (1, 2)), ("layers.1.bias", (1,))]

CHECKPOINT_METADATA = {"format": "mptrain-checkpoint-v1", "step": "12", "data_cursor": "5",
                       "scale": "0x1.8p+14", "growth_tracker": "3", "skipped_total": "2",
                       "steps_done": "12"}


def checkpoint(metadata=CHECKPOINT_METADATA, shapes=CHECKPOINT_SHAPES, momentum=True,
               poison=None):
    entries, value = [], 0.0
    prefixes = ["", "momentum."] if momentum else [""]
    for prefix in prefixes:
        for name, shape in shapes:
            count = 1
            for d in shape:
                count *= d
            values = [value + i * 0.25 for i in range(count)]
            value += count
            if poison is not None and prefix + name == poison:
                values[0] = float("nan")
            entries.append((prefix + name, "F32", shape, f32(*values)))
    return safetensors(entries, metadata=metadata)


def checkpoint_corpus():
    write("checkpoint_fuzzer", "valid", checkpoint())
    write("checkpoint_fuzzer", "initial_only", checkpoint(metadata={}, momentum=False))
    write("checkpoint_fuzzer", "bad_scale", checkpoint(dict(CHECKPOINT_METADATA, scale="inf")))
    write("checkpoint_fuzzer", "tracker_overflow",
          checkpoint(dict(CHECKPOINT_METADATA, growth_tracker="2147483648")))
    write("checkpoint_fuzzer", "negative_step", checkpoint(dict(CHECKPOINT_METADATA, step="-1")))
    write("checkpoint_fuzzer", "wrong_shape",
          checkpoint(shapes=[("layers.0.weight", (3, 2))] + CHECKPOINT_SHAPES[1:]))
    write("checkpoint_fuzzer", "nan_momentum", checkpoint(poison="momentum.layers.1.bias"))
    write("checkpoint_fuzzer", "wrong_format",
          checkpoint(dict(CHECKPOINT_METADATA, format="mptrain-checkpoint-v0")))


# ---- coordinator state machine ----
#
# FuzzedDataProvider hands out integers from the END of the input, most significant byte
# first, each using as many bytes as its range needs. The harness consumes only integers, so
# an input is the reversed sequence of its choices. Each choice below is (value, min, max) in
# the order coordinator_state_fuzzer.cc consumes it; after each operation CheckInvariants takes
# a page size in [0, 4].

(REGISTER, HEARTBEAT, POLL, DEREGISTER, SUBMIT, CANCEL, EXIT, TELEMETRY, RESULT, KV_SET, KV_GET,
 ADVANCE, TICK, LIVENESS, LIST_BAD, WATCH, QUIESCE) = range(17)


class Script:
    def __init__(self):
        self.consumed = []

    def take(self, value, low, high):
        span, result, size = high - low, value - low, 0
        assert 0 <= result <= span
        while size < 8 and (span >> (8 * size)) > 0:
            size += 1
        self.consumed += list(result.to_bytes(size, "big")) if size else []

    def op(self, operation, *choices):
        self.take(operation, 0, 16)
        for value, low, high in choices:
            self.take(value, low, high)
        self.take(1, 0, 4)  # CheckInvariants' page size.
        return self

    def data(self):
        return bytes(reversed(self.consumed))


B = (0, 0, 255)        # ConsumeBool() == false (right secret / first branch)
T = (1, 0, 255)        # ConsumeBool() == true
RIGHT = (0, 0, 7)      # MaybeWrong: the right secret
WRONG = (7, 0, 7)      # MaybeWrong: a wrong secret


def register(name, cuda, slots, memory, roots=False, device_memory=None):
    choices = [(name, 0, 4), T if cuda else B, (slots, 0, 4), (1, 1, 3), (memory, 0, 3)]
    if cuda:
        if device_memory is None:
            choices.append(B)
        else:
            choices.append(T)
            choices += [(device_memory, 0, 3)] * slots
    choices.append(T if roots else B)
    return choices


def submit(world_size, cuda=False, flags=0, extra=()):
    return [(world_size, 1, 4), T if cuda else B, (flags, 0, 255)] + list(extra) + [B]


def coordinator_corpus():
    # Happy path: a worker, a 2-rank job, both ranks succeed and exit.
    s = Script()
    s.op(REGISTER, *register(0, False, 2, 2))
    s.op(SUBMIT, *submit(2))
    s.op(POLL, RIGHT, (0, 0, 7))
    s.op(RESULT, B, (0, 0, 1), (0, 0, 5), B, RIGHT)
    s.op(RESULT, B, (1, 0, 1), (0, 0, 5), B, RIGHT)
    s.op(EXIT, B, (0, 0, 1), (0, 0, 3), RIGHT)
    s.op(EXIT, B, (0, 0, 0), (0, 0, 3), RIGHT)
    s.op(TICK, (1000, 1000, 5000))
    write("coordinator_state_fuzzer", "succeed", s.data())

    # Rendezvous and telemetry on a CUDA worker, then it goes silent: the job restarts (max
    # restarts 1) and, with no other worker, waits.
    s = Script()
    s.op(REGISTER, *register(1, True, 4, 0, roots=True, device_memory=3))
    s.op(SUBMIT, *submit(4, cuda=True, flags=0x12, extra=[(1, 0, 2)]))
    s.op(POLL, RIGHT, (0, 0, 7))
    s.op(KV_SET, B, (0, 0, 3), (0, 0, 4), (16, 0, 300), B, RIGHT)
    s.op(KV_GET, B, (1, 0, 3), (0, 0, 4), RIGHT)
    s.op(TELEMETRY, B, (0, 0, 3), (3, -1, 10), (1, 0, 2), (1, 0, 3), RIGHT)
    s.op(ADVANCE, (15000, 0, 15000))
    s.op(WATCH, (0, 0, 15), (0, 0, 0), (0, 0, 40))
    write("coordinator_state_fuzzer", "rendezvous_then_lost", s.data())

    # Two workers; the first leaves: the job restarts on the second; then it is cancelled.
    s = Script()
    s.op(REGISTER, *register(0, False, 2, 3))
    s.op(REGISTER, *register(1, False, 2, 3))
    s.op(SUBMIT, *submit(2, flags=0x02, extra=[(2, 0, 2)]))
    s.op(POLL, (0, 0, 1), RIGHT, (0, 0, 7))
    s.op(DEREGISTER, (0, 0, 1), B, RIGHT)
    s.op(POLL, (1, 0, 1), RIGHT, (0, 0, 7))
    s.op(CANCEL, (0, 0, 15), (0, 0, 0), B, T)
    s.op(QUIESCE)
    write("coordinator_state_fuzzer", "restart_then_cancel", s.data())

    # A job too big for the only worker's slots times out in the queue.
    s = Script()
    s.op(REGISTER, *register(2, False, 2, 2))
    s.op(SUBMIT, *submit(4, flags=0x01, extra=[(5, 1, 30)]))
    for _ in range(3):
        s.op(TICK, (2500, 1000, 5000))
    s.op(LIST_BAD, T, B)
    write("coordinator_state_fuzzer", "queue_timeout", s.data())

    # Wrong secrets everywhere, a rank error and a collective failure.
    s = Script()
    s.op(REGISTER, *register(3, False, 4, 3))
    s.op(SUBMIT, *submit(3, flags=0x20))
    s.op(HEARTBEAT, (0, 0, 7), WRONG)
    s.op(POLL, WRONG, (0, 0, 7))
    s.op(POLL, RIGHT, (7, 0, 7), (0, 0, 15), (0, 0, 0), (2, -1, 4), (1, 0, 4))
    s.op(KV_SET, B, (0, 0, 2), (1, 0, 4), (8, 0, 300), T, WRONG)
    s.op(RESULT, B, (1, 0, 2), (5, 0, 5), RIGHT)
    s.op(RESULT, B, (2, 0, 2), (4, 0, 5), RIGHT)
    write("coordinator_state_fuzzer", "wrong_secrets_and_errors", s.data())


# ---- token files (llm.c shards and raw uint16) ----

def shard(tokens, magic=20240520, version=1, count=None):
    header = struct.pack("<3i", magic, version, len(tokens) if count is None else count)
    return header + bytes(1024 - len(header)) + struct.pack(f"<{len(tokens)}H", *tokens)


def token_shard_corpus():
    text = b"In the beginning God created the heaven and the earth. " * 3
    write("token_shard_fuzzer", "shard_bytes", shard(list(text)))
    write("token_shard_fuzzer", "shard_gpt2_ids", shard([50256, 464, 3290, 50000] * 20))
    write("token_shard_fuzzer", "raw_bytes", struct.pack(f"<{len(text)}H", *text))
    write("token_shard_fuzzer", "raw_out_of_byte_vocab", struct.pack("<40H", *range(240, 280)))
    write("token_shard_fuzzer", "shard_bad_version", shard(list(text), version=2))
    write("token_shard_fuzzer", "shard_count_too_high", shard(list(text), count=len(text) + 1))
    write("token_shard_fuzzer", "shard_count_huge", shard(list(text), count=987654321))
    write("token_shard_fuzzer", "shard_truncated_header", shard(list(text))[:600])
    write("token_shard_fuzzer", "raw_odd", b"abc")
    write("token_shard_fuzzer", "raw_tiny", b"ab")


def main():
    if os.path.isdir(CORPUS):
        shutil.rmtree(CORPUS)
    job_spec_corpus()
    npy_corpus()
    safetensors_corpus()
    checkpoint_corpus()
    coordinator_corpus()
    token_shard_corpus()


if __name__ == "__main__":
    main()
