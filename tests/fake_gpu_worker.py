#!/usr/bin/env python3
"""A worker daemon's heartbeats as a GPU machine sends them, for tests on a machine without GPUs
(tests/observability_test.sh): registers as a CUDA worker of two GPUs, checks that a hostile
usage (101 % busy) is refused naming its field, then heartbeats every half second with usage:
GPU 0 read (30 of 80 GiB in use, 75 % busy), GPU 1 unavailable (as without NVML), 40 of 64 GiB
of host memory available. Writes READY_FILE after its first accepted heartbeat; runs until it is
killed. It runs no ranks (it never polls), so no job may ask for CUDA while it lives.

  fake_gpu_worker.py PYTHON_DIR COORDINATOR NAME READY_FILE
"""
import os
import random
import sys
import time

sys.path.insert(0, sys.argv[1])
import grpc  # noqa: E402
from mptrain._proto import mptrain_pb2 as pb  # noqa: E402
from mptrain._proto import mptrain_pb2_grpc as pb_grpc  # noqa: E402

GIB = 1 << 30


def usage(utilization=75):
    reading = pb.WorkerUsage(memory_available_bytes=40 * GIB, memory_total_bytes=64 * GIB)
    reading.devices.add(index=0, available=True, memory_used_bytes=30 * GIB,
                        memory_total_bytes=80 * GIB, utilization_percent=utilization)
    reading.devices.add(index=1)  # Not available: no figures.
    return reading


def main():
    _, _, coordinator, name, ready_file = sys.argv
    stub = pb_grpc.WorkerControlStub(grpc.insecure_channel(coordinator))
    incarnation = random.getrandbits(63)
    registered = stub.RegisterWorker(pb.RegisterWorkerRequest(
        host="127.0.0.1", device=pb.CUDA, slots=2, incarnation=incarnation, name=name,
        devices=[pb.DeviceInfo(index=i, name="Fake GPU", memory_bytes=80 * GIB) for i in (0, 1)]),
        timeout=10)
    heartbeat = pb.HeartbeatRequest(worker_id=registered.worker_id, incarnation=incarnation,
                                    worker_secret=registered.worker_secret, usage_age_ms=5)
    hostile = pb.HeartbeatRequest()
    hostile.CopyFrom(heartbeat)
    hostile.usage.CopyFrom(usage(utilization=101))
    try:
        stub.Heartbeat(hostile, timeout=10)
        sys.exit(f"{name}: a usage 101 % busy was accepted")
    except grpc.RpcError as error:
        expected = "usage.devices[0].utilization_percent must be in [0, 100], got 101"
        if error.code() != grpc.StatusCode.INVALID_ARGUMENT or error.details() != expected:
            sys.exit(f"{name}: a usage 101 % busy answered {error.code()}: {error.details()}")
        print(f"{name}: hostile usage refused: {error.details()}", flush=True)
    heartbeat.usage.CopyFrom(usage())
    ready = False
    while True:
        stub.Heartbeat(heartbeat, timeout=10)
        if not ready:
            with open(ready_file + ".tmp", "w") as out:
                out.write(registered.worker_id + "\n")
            os.rename(ready_file + ".tmp", ready_file)
            ready = True
        time.sleep(0.5)


if __name__ == "__main__":
    main()
