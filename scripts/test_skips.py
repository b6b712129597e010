#!/usr/bin/python3
"""Which tests skipped, and whether they had to.

  test_skips.py summary DIR       every test target under DIR (bazel-testlogs) with its test
                                  count and skipped count, the skipped tests named; exit 0
                                  (a report: CI prints it after `bazel test`)
  test_skips.py gpus N XML        a GoogleTest XML report of a run on a machine with N GPUs:
                                  exit 1 when a test skipped that this machine could run (its
                                  skip message does not say "needs K CUDA GPU(s)" with K > N),
                                  naming it; those that need more GPUs are listed, not failed

A gtest target's skips come from its test.xml (result="skipped"); a shell test's from the
lines of its test.log that start with "SKIPPED" (the convention of tests/*.sh), since the
test.xml Bazel writes for it has no per-test results.
"""
import os
import re
import sys
import xml.etree.ElementTree as ElementTree

# The reason cuda_backend_test's REQUIRE_GPUS gives.
NEEDS_GPUS = re.compile(r"needs (\d+) CUDA GPU\(s\)")


def gtest_cases(xml_path):
    """[(name, skipped, skip message)] of a GoogleTest XML report; [] for Bazel's own XML of
    a non-gtest target (a testcase without a classname). Raises ValueError if unreadable."""
    try:
        root = ElementTree.parse(xml_path).getroot()
    except (ElementTree.ParseError, OSError) as error:
        raise ValueError(f"{xml_path}: not a readable XML report ({error})") from None
    cases = []
    for case in root.iter("testcase"):
        classname = case.get("classname")
        if classname is None:
            continue
        skipped_element = case.find("skipped")
        skipped = case.get("result") == "skipped" or skipped_element is not None
        message = "" if skipped_element is None else (skipped_element.get("message") or "")
        cases.append((f"{classname}.{case.get('name')}", skipped, message))
    return cases


def shell_skips(log_path):
    """The lines of a shell test's log that say it skipped a part."""
    try:
        with open(log_path, errors="replace") as log:
            return [line.strip() for line in log if line.startswith("SKIPPED")]
    except OSError:
        return []


def summarize(testlogs):
    """[(target, tests or None, [skipped descriptions])] for each test.xml under testlogs."""
    rows = []
    for directory, _, files in sorted(os.walk(testlogs, followlinks=True)):
        if "test.xml" not in files:
            continue
        target = os.path.relpath(directory, testlogs)
        # Sharded or repeated runs: shard_1_of_2/, run_1_of_3/ belong to the target above.
        target = re.sub(r"/(shard|run)_\d+_of_\d+(/.*)?$", "", target)
        try:
            cases = gtest_cases(os.path.join(directory, "test.xml"))
        except ValueError as error:
            rows.append((target, None, [str(error)]))
            continue
        if cases:
            skipped = [f"{name}: {message.splitlines()[-1] if message else 'skipped'}"
                       for name, was_skipped, message in cases if was_skipped]
            rows.append((target, len(cases), skipped))
        else:
            rows.append((target, None, shell_skips(os.path.join(directory, "test.log"))))
    merged = {}
    for target, tests, skipped in rows:
        if target in merged:
            old_tests, old_skipped = merged[target]
            tests = None if old_tests is None or tests is None else old_tests + tests
            skipped = old_skipped + skipped
        merged[target] = (tests, skipped)
    return [(target, tests, skipped) for target, (tests, skipped) in sorted(merged.items())]


def label(target):
    """bazel-testlogs/<package>/<name> as a label: //package:name."""
    package, _, name = target.rpartition("/")
    return f"//{package}:{name}"


def print_summary(rows, out=sys.stdout):
    total = sum(len(skipped) for _, _, skipped in rows)
    print(f"skipped tests per target ({len(rows)} targets, {total} skipped):", file=out)
    width = max([len(target) for target, _, _ in rows] + [6])
    for target, tests, skipped in rows:
        count = "-" if tests is None else str(tests)
        print(f"  {label(target):<{width + 2}} tests {count:>4}  skipped {len(skipped):>3}",
              file=out)
        for line in skipped[:5]:
            print(f"      {line[:150]}", file=out)
        if len(skipped) > 5:
            print(f"      ... and {len(skipped) - 5} more", file=out)


def check_gpu_skips(xml_path, gpus, out=sys.stdout):
    """True when no test of xml_path skipped that a machine with `gpus` GPUs could run."""
    try:
        cases = gtest_cases(xml_path)
    except ValueError as error:
        print(f"FAIL: {error}", file=out)
        return False
    if not cases:
        print(f"FAIL: {xml_path} lists no test", file=out)
        return False
    could_run, cannot_run = [], []
    for name, skipped, message in cases:
        if not skipped:
            continue
        needs = NEEDS_GPUS.search(message)
        reason = message.splitlines()[-1] if message else "skipped without a reason"
        if needs and int(needs.group(1)) > gpus:
            cannot_run.append(f"{name} (needs {needs.group(1)} GPUs)")
        else:
            could_run.append(f"{name}: {reason}")
    ran = sum(1 for _, skipped, _ in cases if not skipped)
    print(f"{ran} of {len(cases)} tests ran on {gpus} GPU(s)", file=out)
    if cannot_run:
        print(f"{len(cannot_run)} not run, this machine has too few GPUs ({gpus}):", file=out)
        for line in cannot_run:
            print(f"  {line}", file=out)
    if could_run:
        print(f"FAIL: skipped although this machine could run them ({len(could_run)}):", file=out)
        for line in could_run:
            print(f"  {line}", file=out)
    return not could_run


def main(argv):
    if len(argv) == 3 and argv[1] == "summary":
        print_summary(summarize(argv[2]))
        return 0
    if len(argv) == 4 and argv[1] == "gpus" and argv[2].isdigit():
        return 0 if check_gpu_skips(argv[3], int(argv[2])) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
