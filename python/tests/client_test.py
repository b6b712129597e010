"""The Python client against a real coordinator and a CPU worker (Debian's python3-grpcio):
submit, watch from the first step, status, list, logs, cancel of several jobs, telemetry as a
pandas DataFrame, the config file's contexts and MPTRAIN_COORDINATOR, and hostile input refused.

    client_test.py --bin DIR --out DIR   (DIR holding coordinator, worker)
"""
import argparse
import math
import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import grpc  # noqa: E402
import mptrain  # noqa: E402

ARGS = None

SPEC = {
    "name": "python-client", "world_size": 1, "device": "cpu",
    "model": {"input_dim": 8, "hidden_dims": [4], "output_dim": 2, "activation": "relu"},
    "loss": "mse", "data": {"synthetic": {"seed": 0}}, "micro_batch_size": 4, "steps": 6,
    "precision": "fp32", "optimizer": {"lr": 0.01}, "telemetry_every": 1,
}


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


class Cluster:
    def __init__(self, bin_dir, out):
        os.makedirs(out, exist_ok=True)
        self.processes = []
        port_file = os.path.join(out, "port")
        self._spawn(out, "coordinator", [f"{bin_dir}/coordinator", "--listen=127.0.0.1:0",
                                         f"--port_file={port_file}", "--ephemeral"])
        deadline = time.time() + 20
        while not read(port_file):
            if time.time() > deadline or self.processes[0].poll() is not None:
                raise RuntimeError("the coordinator did not start: see coordinator.log")
            time.sleep(0.05)
        self.address = "127.0.0.1:" + read(port_file)
        self._spawn(out, "worker", [f"{bin_dir}/worker", f"--coordinator={self.address}",
                                    "--device=cpu", "--slots=1", "--name=w0",
                                    f"--work_dir={out}/w0", f"--data_root={out}",
                                    f"--output_root={out}"])

    def _spawn(self, out, name, argv):
        with open(os.path.join(out, name + ".log"), "w") as log:
            self.processes.append(subprocess.Popen(argv, stdout=log, stderr=log))

    def close(self):
        for process in reversed(self.processes):
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(ARGS.bin, ARGS.out)
        cls.client = mptrain.Client(cls.cluster.address)
        # The worker registered: a 1-rank job can be placed.
        deadline = time.time() + 30
        while True:
            workers = cls.client._call("ListWorkers", mptrain.client.pb.ListWorkersRequest())
            if any(w.state == mptrain.client.pb.ALIVE for w in workers.workers):
                break
            if time.time() > deadline:
                raise RuntimeError("no worker registered: see worker.log")
            time.sleep(0.1)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.close()

    def test_submit_watch_status_telemetry_logs(self):
        job = self.client.submit(SPEC)
        steps = [record["step"] for record in self.client.watch(job, raise_on_failure=True)]
        self.assertEqual(steps, [1, 2, 3, 4, 5, 6], "every step once, in order, from the first")
        status = self.client.status(job)
        self.assertEqual(status["state"], "SUCCEEDED")
        self.assertEqual(status["placement"][0]["rank"], 0, "defaults are present")
        self.assertIsInstance(status["submitted_unix_ms"], int)
        rows = self.client.telemetry(job)
        self.assertEqual([row["step"] for row in rows], steps)
        self.assertTrue(all(math.isfinite(row["loss"]) for row in rows))
        frame = self.client.telemetry_frame(job)
        import pandas  # scripts/setup.sh installs python3-pandas: the frame path is tested.
        self.assertIsInstance(frame, pandas.DataFrame)
        self.assertEqual(list(frame["step"]), steps)
        self.assertIsInstance(self.client.logs(job), str)
        self.assertEqual(self.client.list()[0]["job_id"], job, "newest first")

    def test_cancel_several_pending_jobs(self):
        waiting = dict(SPEC, world_size=4, name="too-wide",  # 1 slot: both wait.
                       labels={"suite": "cancel", "Team": "vision"})
        # Names are unique among an owner's live jobs: the second waits under its own.
        first, second = self.client.submit(waiting), self.client.submit(
            dict(waiting, name="too-wide-2"))
        self.assertEqual([job["job_id"] for job in self.client.list(labels={"suite": "cancel"})],
                         [second, first])
        self.assertEqual(self.client.status(first)["spec"]["labels"],
                         {"suite": "cancel", "Team": "vision"})
        self.assertIn("needs 4 cpu slots", self.client.status(first)["pending_reason"])
        self.assertEqual(self.client.cancel(first, second),
                         {first: "CANCELLED", second: "CANCELLED"})
        with self.assertRaises(mptrain.JobFailed) as failed:
            list(self.client.watch(first, raise_on_failure=True))
        self.assertEqual(failed.exception.state, "CANCELLED")

    def test_watch_reconnects_on_unavailable(self):
        """A stream broken with UNAVAILABLE (a restarting coordinator) is opened again with
        back-off; every record comes once. Other codes, and a stream down for longer than
        reconnect_timeout_s, raise."""
        # Long enough to be running when the watch starts, on a loaded machine too (a job that
        # ended first gave the first answer every record and the state, nothing was broken, and
        # the test failed in CI with 8 steps of SPEC's model, then with 600 of them): 600 steps
        # of ~250,000 times the multiply-adds of SPEC's take seconds. Few enough records for
        # the job's telemetry history (1,000) to hold every step.
        job = self.client.submit(dict(
            SPEC, name="reconnected", steps=600, micro_batch_size=128,
            model={"input_dim": 128, "hidden_dims": [512, 512], "output_dim": 2,
                   "activation": "relu"}))
        real = self.client._stub.WatchJob
        calls = []

        class Unavailable(grpc.RpcError):
            def __init__(self, code=grpc.StatusCode.UNAVAILABLE):
                self._code = code

            def code(self):
                return self._code

        class Broken:
            """The real stream for `keep` messages, then the error (a coordinator gone)."""

            def __init__(self, stream, keep, code):
                self.stream, self.keep, self.code = stream, keep, code

            def __iter__(self):
                for _ in range(self.keep):
                    yield next(self.stream)
                raise Unavailable(self.code)

            def cancel(self):
                self.stream.cancel()

        def flaky(request, metadata=None):
            calls.append(time.monotonic())
            stream = real(request, metadata=metadata)
            if len(calls) <= 3:  # Broken after 2 messages, then at once, twice.
                return Broken(stream, 2 if len(calls) == 1 else 0, grpc.StatusCode.UNAVAILABLE)
            return stream

        self.client._stub.WatchJob = flaky
        try:
            steps = [r["step"] for r in self.client.watch(job)]
        finally:
            self.client._stub.WatchJob = real
        self.assertEqual(steps, list(range(1, 601)), "every record once, in order")
        self.assertEqual(len(calls), 4, "one stream, two broken at once, the real one (a single "
                         "call: the job ended before its watch opened, nothing was broken)")
        gaps = [b - a for a, b in zip(calls, calls[1:])]
        self.assertGreaterEqual(gaps[1], 0.9 * 2 * mptrain.Client.RECONNECT_FIRST_S,
                                f"backed off, doubling: {gaps}")

        # Down for good: raised after the timeout, not retried for ever.
        self.client._stub.WatchJob = lambda request, metadata=None: Broken(
            real(request, metadata=metadata), 0, grpc.StatusCode.UNAVAILABLE)
        started = time.monotonic()
        try:
            with self.assertRaises(grpc.RpcError) as raised:
                list(self.client.watch(job, reconnect_timeout_s=0.5))
            self.assertEqual(raised.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertLess(time.monotonic() - started, 5)
            # Another code is not a reason to retry.
            self.client._stub.WatchJob = lambda request, metadata=None: Broken(
                real(request, metadata=metadata), 0, grpc.StatusCode.PERMISSION_DENIED)
            with self.assertRaises(grpc.RpcError) as raised:
                list(self.client.watch(job))
            self.assertEqual(raised.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
        finally:
            self.client._stub.WatchJob = real

    def test_bad_spec_names_the_field(self):
        with self.assertRaises(ValueError) as error:
            self.client.submit(dict(SPEC, world_sise=2))
        self.assertIn("world_sise", str(error.exception))
        with self.assertRaises(grpc.RpcError) as refused:
            self.client.submit(dict(SPEC, steps=-1))
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_unknown_job_is_not_found(self):
        with self.assertRaises(grpc.RpcError) as missing:
            self.client.status("job-9999")
        self.assertEqual(missing.exception.code(), grpc.StatusCode.NOT_FOUND)


class ConfigTest(unittest.TestCase):
    """Client() finds the coordinator as trainctl does: argument, environment, context."""

    def setUp(self):
        self.saved = dict(os.environ)
        self.path = os.path.join(ARGS.out, f"config-{self.id().rsplit('.', 1)[-1]}")
        os.environ["MPTRAIN_CONFIG"] = self.path
        for name in ("MPTRAIN_COORDINATOR", "MPTRAIN_CONTEXT", "MPTRAIN_TOKEN"):
            os.environ.pop(name, None)

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self.saved)

    def write(self, text, mode=0o600):
        with open(self.path, "w") as f:
            f.write(text)
        os.chmod(self.path, mode)

    def test_context_then_environment_then_argument(self):
        self.write("current-context = a\n[context a]\ncoordinator = 127.0.0.1:9\n"
                   "[context b]\ncoordinator = 127.0.0.1:10\n")
        self.assertEqual(mptrain.Client().coordinator, "127.0.0.1:9")
        self.assertEqual(mptrain.Client(context="b").coordinator, "127.0.0.1:10")
        os.environ["MPTRAIN_COORDINATOR"] = "127.0.0.1:11"
        self.assertEqual(mptrain.Client().coordinator, "127.0.0.1:11")
        self.assertEqual(mptrain.Client("127.0.0.1:12").coordinator, "127.0.0.1:12")

    def test_the_file_trainctl_writes_is_read(self):
        if not ARGS.trainctl:
            self.fail("--trainctl is needed")
        subprocess.run([ARGS.trainctl, "config", "set-context", "t", "--coordinator",
                        "127.0.0.1:13"], check=True, capture_output=True)
        self.assertEqual(mptrain.Client().coordinator, "127.0.0.1:13")

    def test_hostile_config_is_refused_by_file_and_line_never_echoed(self):
        for text, why in [("[context a]\nroot:SECRET-HASH\n", "line 2: not `key = value`"),
                          ("[context a]\nSECRET = 1\n", "line 2: unknown key"),
                          ("current-context = SECRET\n", "line 1: current-context names no"),
                          ("[context a]\ncoordinator = SECRET\x1b[2J\n", "line 2: a value holds")]:
            self.write(text)
            with self.assertRaises(mptrain.ConfigError) as error:
                mptrain.Client()
            self.assertIn(f"config file {self.path} {why}", str(error.exception))
            self.assertNotIn("SECRET", str(error.exception))
        self.write("[context a]\ncoordinator = h:1\n", mode=0o644)
        with self.assertRaises(mptrain.ConfigError) as error:
            mptrain.Client()
        self.assertIn("chmod 600", str(error.exception))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--trainctl")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
