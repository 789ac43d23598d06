"""What the cmfhost CLI tests share: named checks that print ok/FAIL and are
counted, and a cmfhost call that turns an unexpected exit status into a
failed check (printing the command and the tail of its output)."""
import subprocess
import sys

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run_cmfhost(cmfhost, args, stdin=None, expect=0):
    p = subprocess.run([cmfhost] + args, input=stdin, capture_output=True, timeout=300)
    if expect is not None and p.returncode != expect:
        print("command:", " ".join([cmfhost] + args))
        print("stdout:", p.stdout.decode(errors="replace")[-2000:])
        print("stderr:", p.stderr.decode(errors="replace")[-2000:])
        check(False, f"exit status {p.returncode} (expected {expect}) of {' '.join(args[:1])}")
    return p


def finish():
    """Exit 1 when a check failed."""
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")
