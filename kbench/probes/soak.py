"""Soak benchmark: resident memory (RSS) over many backend ops and many Manager lifetimes.

    kbench probe soak [--ops 1000000] [--managers 10000] [--max-seconds 600]
                      [--device 0] [--out results/<device>/soak-<date>.json]

Phase 1 issues ``--ops`` VulkanBackend ops (silu, add, element_mul, copy_buffer and rms_norm in
turn on 4 KiB buffers, a synchronize every 1000 ops); phase 2 runs ``--managers`` cycles of
Manager() -> tensor -> sequence(sync up, sync down) -> destroy. Each phase stops early at its
share of ``--max-seconds`` (half each) and records how far it got, so a slow device (lavapipe on
two shared cores) gives an honest partial count. RSS is sampled from /proc/self/status at about
50 points per phase. A leak shows as RSS that keeps growing after the first checkpoints; the
result file holds every sample, the start, the end and the maximum. Not a test: no assertion,
only numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc), else the peak from getrusage."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _phase(name: str, total: int, seconds: float, step: Callable[[int], None], every: int,
           finish: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Run ``step(i)`` for i < total or until ``seconds`` passed; RSS every ``every`` steps."""
    samples: list[tuple[int, float, int]] = []
    t0 = time.monotonic()
    start_rss = rss_bytes()
    done = 0
    stopped_by = "count"
    while done < total:
        step(done)
        done += 1
        if done % every == 0:
            finish()
            elapsed = time.monotonic() - t0
            samples.append((done, round(elapsed, 3), rss_bytes()))
            print(f"  {name}: {done} in {elapsed:.1f} s, RSS {samples[-1][2] / 2**20:.1f} MiB", file=sys.stderr,
                  flush=True)
            if elapsed > seconds:
                stopped_by = "time"
                break
    finish()
    elapsed = time.monotonic() - t0
    end_rss = rss_bytes()
    if not samples or samples[-1][0] != done:
        samples.append((done, round(elapsed, 3), end_rss))
    rss = [s[2] for s in samples]
    return {"requested": total, "completed": done, "stopped_by": stopped_by, "seconds": round(elapsed, 2),
            "rate_per_s": round(done / elapsed, 1) if elapsed else None,
            "rss_start": start_rss, "rss_end": end_rss, "rss_max": max(rss + [start_rss]),
            # growth over the second half of the run: what a leak adds once caches are warm
            "rss_growth_second_half": rss[-1] - rss[len(rss) // 2] if len(rss) >= 2 else 0,
            "samples": [{"count": c, "seconds": s, "rss": r} for c, s, r in samples]}


def backend_ops(total: int, seconds: float, device: int) -> dict[str, Any]:
    from kbench.backend.vulkan_backend import VulkanBackend

    with VulkanBackend(device, validation=False) as b:
        n = 1024
        bufs = [b.allocate(4 * n) for _ in range(4)]
        data = np.linspace(-1, 1, n, dtype=np.float32)
        for h in bufs:
            b.copy_to_device(data, h)
        x, y, z, w = bufs

        def step(i: int) -> None:
            k = i % 5
            if k == 0:
                b.silu(x, y, n)
            elif k == 1:
                b.add(x, y, z, n)
            elif k == 2:
                b.element_mul(x, z, y, n)
            elif k == 3:
                b.copy_buffer(y, z, 4 * n)
            else:
                b.rms_norm(x, w, z, n, 1e-5)
            if i % 1000 == 999:
                b.synchronize()

        result = _phase("backend ops", total, seconds, step, every=max(1, total // 50), finish=b.synchronize)
        result["stats"] = b.cache_stats()
        out = np.zeros(n, np.float32)
        b.copy_from_device(z, out)
        result["finite_output"] = bool(np.isfinite(out).all())
    return result


def manager_cycles(total: int, seconds: float, device: int) -> dict[str, Any]:
    import kbench.runtime as kp

    def step(i: int) -> None:
        mgr = kp.Manager(device, validation=False)
        t = mgr.tensor(np.full(256, float(i % 7), np.float32))
        seq = mgr.sequence()
        seq.eval(kp.OpTensorSyncDevice([t]))
        seq.eval(kp.OpTensorSyncLocal([t]))
        assert t.data()[0] == float(i % 7)
        mgr.destroy()

    return _phase("Manager cycles", total, seconds, step, every=max(1, total // 50))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kbench probe soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=1_000_000, help="backend ops (default 1000000)")
    p.add_argument("--managers", type=int, default=10_000, help="Manager cycles (default 10000)")
    p.add_argument("--max-seconds", type=float, default=600.0,
                   help="time budget, half per phase; a phase over its half stops and says so (default 600)")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--out", help="result file (default: print the JSON)")
    args = p.parse_args(argv)
    from importlib.metadata import PackageNotFoundError, version

    import kbench.runtime as kp

    try:
        kbench_version = version("kbench")
    except PackageNotFoundError:
        kbench_version = "unknown"

    props = kp.list_devices()[args.device]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    half = args.max_seconds / 2
    result = {
        "kind": "soak", "started": started, "kbench_version": kbench_version,
        "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "device_name": props.get("device_name"), "driver_name": props.get("driver_name"),
        "driver_version": props.get("driver_version"), "max_seconds": args.max_seconds,
        "backend_ops": backend_ops(args.ops, half, args.device),
        "manager_cycles": manager_cycles(args.managers, half, args.device),
    }
    text = json.dumps(result, indent=1)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        print(f"soak result written: {out}", file=sys.stderr)
    else:
        print(text)
    for phase in ("backend_ops", "manager_cycles"):
        r = result[phase]
        print(f"{phase}: {r['completed']}/{r['requested']} in {r['seconds']} s (stopped by {r['stopped_by']}), "
              f"RSS {r['rss_start'] / 2**20:.1f} -> {r['rss_end'] / 2**20:.1f} MiB (max {r['rss_max'] / 2**20:.1f}, "
              f"second-half growth {r['rss_growth_second_half'] / 2**20:+.1f})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
