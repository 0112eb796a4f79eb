"""The Spark repack benchmark counts the CPU of every process the command starts, including
one whose parent never waits for it (Spark's Python workers): the kernel does not add such a
process's time to anyone's children's usage."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SPIN_S = 1.0

# The parent ignores SIGCHLD, so the kernel reaps its child and the child's CPU time is never
# added to the parent's (nor, then, to ours).
SCRIPT = textwrap.dedent(f"""
    import os, signal, time
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    if os.fork() == 0:
        while os.times().user + os.times().system < {SPIN_S}:
            pass
        os._exit(0)
    time.sleep(0.3)
    while True:  # until the kernel has reaped the child
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        time.sleep(0.05)
    print("done")
""")


def test_cpu_of_a_process_nobody_waits_for_is_counted():
    # in a process of its own, as the benchmark runs: it waits for every descendant, and a
    # test process has others (a Spark session, an emulator)
    measure = ("import json, sys; from trainfeed.benchmarks.micro.spark_repack_bench import become_subreaper, timed; "
               "become_subreaper(); print(json.dumps(timed([sys.executable, '-c', sys.argv[1]])))")
    res = subprocess.run([sys.executable, "-c", measure, SCRIPT], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    seconds, cpu, stdout = json.loads(res.stdout)
    assert stdout.strip() == "done"
    # polled every 0.1 s: at most the last poll interval of the child's CPU can be missed
    assert cpu >= SPIN_S - 0.15, cpu
    assert cpu <= seconds * 2 + 0.5  # no more than two cores' worth of the wall time
