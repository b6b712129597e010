#!/usr/bin/python3
"""scripts/test_skips.py on synthetic reports: the skip counts per target (gtest and shell
targets, shards merged) and the GPU machine's verdict (a skip it could run fails, one that
needs more GPUs is listed)."""
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__))))
import test_skips  # noqa: E402


def gtest_xml(cases):
    """A GoogleTest 1.12 XML report of cases [(classname, name, skip message or None)]."""
    body = []
    for classname, name, skip in cases:
        if skip is None:
            body.append(f'<testcase name="{name}" status="run" result="completed" '
                        f'classname="{classname}" />')
        else:
            body.append(f'<testcase name="{name}" status="run" result="skipped" '
                        f'classname="{classname}"><skipped message="x.cc:45&#x0A;{skip}">'
                        f'<![CDATA[x.cc:45\n{skip}]]></skipped></testcase>')
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites tests="1" name="AllTests">'
            '<testsuite name="S">' + "".join(body) + "</testsuite></testsuites>")


BAZEL_SHELL_XML = ('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite name="t">'
                   '<testcase name="tests/t" status="run" duration="1" time="1"></testcase>'
                   '</testsuite></testsuites>')
NEEDS_ONE = "needs 1 CUDA GPU(s), 0 visible: runs on the GPU machine"
NEEDS_TWO = "needs 2 CUDA GPU(s), 1 visible: runs on the GPU machine"


class TestSkipsTest(unittest.TestCase):
    def setUp(self):
        self.directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    def write(self, relative, text):
        path = os.path.join(self.directory, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as file:
            file.write(text)
        return path

    def check(self, cases, gpus):
        out = io.StringIO()
        ok = test_skips.check_gpu_skips(self.write("cuda.xml", gtest_xml(cases)), gpus, out)
        return ok, out.getvalue()

    def test_summary_CountsGtestAndShellSkipsPerTarget(self):
        self.write("backends/cuda/cuda_backend_test/test.xml",
                   gtest_xml([("Cuda", "A", NEEDS_ONE), ("Cuda", "B", NEEDS_TWO),
                              ("Cuda", "C", None)]))
        self.write("tests/multihost_test/test.xml", BAZEL_SHELL_XML)
        self.write("tests/multihost_test/test.log",
                   "start\nSKIPPED: cannot simulate hosts, missing: root (uid 1000)\n")
        self.write("tests/ok_test/test.xml", BAZEL_SHELL_XML)
        self.write("tests/ok_test/test.log", "all good\n  [  SKIPPED ] is not a shell skip\n")
        rows = test_skips.summarize(self.directory)
        self.assertEqual([(target, tests, len(skipped)) for target, tests, skipped in rows],
                         [("backends/cuda/cuda_backend_test", 3, 2),
                          ("tests/multihost_test", None, 1), ("tests/ok_test", None, 0)])
        self.assertEqual(rows[0][2][0], "Cuda.A: " + NEEDS_ONE)
        out = io.StringIO()
        test_skips.print_summary(rows, out)
        self.assertIn("3 targets, 3 skipped", out.getvalue())
        self.assertIn("//backends/cuda:cuda_backend_test tests    3  skipped   2", out.getvalue())
        self.assertIn("//tests:multihost_test", out.getvalue())

    def test_summary_MergesShardsAndReportsUnreadableXml(self):
        self.write("t/sharded_test/shard_1_of_2/test.xml", gtest_xml([("S", "A", "why")]))
        self.write("t/sharded_test/shard_2_of_2/test.xml", gtest_xml([("S", "B", None)]))
        self.write("t/broken_test/test.xml", "<testsuites><unclosed")
        rows = test_skips.summarize(self.directory)
        self.assertEqual(rows[1][:2], ("t/sharded_test", 2))
        self.assertEqual(rows[1][2], ["S.A: why"])
        self.assertEqual(rows[0][0], "t/broken_test")
        self.assertIn("not a readable XML report", rows[0][2][0])

    def test_gpus_OneGpuMachine_TwoGpuSkipsListedNotFailed(self):
        ok, out = self.check([("Cuda", "One", None), ("Cuda", "Two", NEEDS_TWO)], gpus=1)
        self.assertTrue(ok, out)
        self.assertIn("1 of 2 tests ran on 1 GPU(s)", out)
        self.assertIn("1 not run, this machine has too few GPUs (1):\n  Cuda.Two (needs 2 GPUs)", out)

    def test_gpus_TwoGpuMachine_TwoGpuSkipFails(self):
        ok, out = self.check([("Cuda", "One", None), ("Cuda", "Two", NEEDS_TWO)], gpus=2)
        self.assertFalse(ok)
        self.assertIn("FAIL: skipped although this machine could run them (1):\n  Cuda.Two", out)

    def test_gpus_SkipForAnotherReason_Fails(self):
        ok, out = self.check([("Cuda", "One", "cuBLASLt has no algorithm")], gpus=8)
        self.assertFalse(ok)
        self.assertIn("Cuda.One: cuBLASLt has no algorithm", out)

    def test_gpus_NoGpuSeenOnAGpuMachine_FailsEveryTest(self):
        ok, out = self.check([("Cuda", "One", NEEDS_ONE), ("Cuda", "Two", NEEDS_TWO)], gpus=2)
        self.assertFalse(ok)
        self.assertIn("(2):", out)

    def test_gpus_MissingOrEmptyReport_Fails(self):
        out = io.StringIO()
        self.assertFalse(test_skips.check_gpu_skips(os.path.join(self.directory, "none.xml"),
                                                    2, out))
        self.assertIn("not a readable XML report", out.getvalue())
        ok, out = self.check([], gpus=2)
        self.assertFalse(ok)
        self.assertIn("lists no test", out)

    def test_main_ExitCodes(self):
        path = self.write("cuda.xml", gtest_xml([("Cuda", "Two", NEEDS_TWO)]))
        sys.stdout, saved = io.StringIO(), sys.stdout
        try:
            codes = [test_skips.main(["t", "gpus", "1", path]),
                     test_skips.main(["t", "gpus", "2", path]),
                     test_skips.main(["t", "summary", self.directory])]
        finally:
            sys.stdout = saved
        self.assertEqual(codes, [0, 1, 0])


if __name__ == "__main__":
    unittest.main()
