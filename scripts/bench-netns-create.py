"""What creating a sandbox's network namespace costs: fork, unshare and exit
of a child with the user, mount and PID namespaces, with and without the
network namespace, 400 interleaved pairs in a random order; p50 of each.
Run as root: python3 scripts/bench-netns-create.py
"""

import ctypes
import os
import random
import time

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
BASE = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID
ARMS = {"user, mount, pid": BASE, "user, mount, pid, net": BASE | CLONE_NEWNET}
libc = ctypes.CDLL(None, use_errno=True)


def once(flags: int) -> float:
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc.unshare(flags) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise SystemExit("unshare failed (run as root)")
    return time.perf_counter() - start


samples: dict[str, list[float]] = {name: [] for name in ARMS}
for _ in range(400):
    for name in random.sample(list(ARMS), len(ARMS)):
        samples[name].append(once(ARMS[name]))
p50 = {name: sorted(s)[len(s) // 2] * 1000 for name, s in samples.items()}
for name, ms in p50.items():
    print(f"{name:24} p50 {ms:.3f} ms")
print(f"the network namespace adds {p50['user, mount, pid, net'] - p50['user, mount, pid']:.3f} ms")
