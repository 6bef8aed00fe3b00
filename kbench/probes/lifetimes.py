"""Look for resources the runtime leaks across create/destroy cycles on the real driver.

Counts this process's open file descriptors, threads and resident memory before and after
N cycles of: list_devices, a Manager, and a Manager that runs a dispatch (tensor, algorithm,
sequence, sync back) -- the lifetimes tests/test_runtime_lifetimes.py checks on lavapipe. A
driver's per-device resources (NVIDIA opens several /dev/nvidia* files per VkDevice) show up
here as fds that grow with the cycle count. Then, with --raw-instances, it cycles bare
vkCreateInstance/vkDestroyInstance (what Managers did before they shared the process's
instance) and reports the cycle at which the driver refuses (NVIDIA 580: about 30).

    kbench probe lifetimes --cycles 200 --raw-instances 100
"""

from __future__ import annotations

import argparse
import os
import resource
import sys

import numpy as np


import kbench.runtime as kp
from kbench.runtime.device import Instance


def usage() -> dict:
    fds = os.listdir("/proc/self/fd")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return {"fds": len(fds), "threads": int(status["Threads"]), "rss_mib": int(status["VmRSS"].split()[0]) // 1024}


def fd_targets() -> dict[str, int]:
    out: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            t = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        key = t if t.startswith("/dev/") else t.split(":")[0]
        out[key] = out.get(key, 0) + 1
    return out


def bare_instance() -> None:
    Instance().destroy()


def devices() -> None:
    assert kp.list_devices()


def manager() -> None:
    kp.Manager().destroy()


def dispatch() -> None:
    with kp.Manager() as mgr:
        a = mgr.tensor(np.arange(64, dtype=np.float32))
        b = mgr.tensor(np.ones(64, dtype=np.float32))
        out = mgr.tensor(np.zeros(64, dtype=np.float32))
        algo = mgr.algorithm()  # OpMult builds its own shader into it
        mgr.sequence().record(kp.OpTensorSyncDevice([a, b, out])).record(kp.OpMult([a, b, out], algo)) \
            .record(kp.OpTensorSyncLocal([out])).eval()
        assert float(out.data()[3]) == 3.0, out.data()[:4]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--raw-instances", type=int, default=0, help="bare instance cycles to try at the end")
    args = ap.parse_args(argv)
    print(f"# RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)}")
    bad = 0
    for name, fn in (("devices", devices), ("manager", manager), ("dispatch", dispatch)):
        fn()  # first use: loader and driver libraries, caches
        before, targets0 = usage(), fd_targets()
        for i in range(args.cycles):
            try:
                fn()
            except Exception as exc:
                print(f"{name}: cycle {i} failed: {type(exc).__name__}: {exc}; {usage()}")
                bad += 1
                break
        after, targets1 = usage(), fd_targets()
        grown = {k: targets1.get(k, 0) - v for k, v in targets0.items() if targets1.get(k, 0) != v}
        grown.update({k: v for k, v in targets1.items() if k not in targets0})
        print(f"{name:9} {args.cycles} cycles: fds {before['fds']} -> {after['fds']}, threads "
              f"{before['threads']} -> {after['threads']}, rss {before['rss_mib']} -> {after['rss_mib']} MiB"
              + (f"; fds grown: {grown}" if grown else ""), flush=True)
        bad += after["fds"] > before["fds"] + 2 or after["threads"] > before["threads"] + 2
    print("# LEAK or failure above" if bad else "# no growth")
    for i in range(args.raw_instances):
        try:
            bare_instance()
        except Exception as exc:
            print(f"# bare instances: vkCreateInstance refused at cycle {i}: {type(exc).__name__}: {exc}")
            break
    else:
        if args.raw_instances:
            print(f"# bare instances: {args.raw_instances} create/destroy cycles all succeeded")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
