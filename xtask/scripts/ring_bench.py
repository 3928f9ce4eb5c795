"""Ring experiments on one machine: loopback overhead per hop, idle nodes, the
prefetch-release conflict under a cgroup-v1 memory limit, and the cost of sealed links.

Run through `cargo xtask ring-bench [overhead|residency|secure]`. Prints tables and writes one
JSON report; every figure is a median over alternating repetitions in the same run.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

TPOT = re.compile(r"TPOT ([0-9.]+) ms")
TTFT = re.compile(r"TTFT ([0-9.]+) ms")
CGROUP = Path("/sys/fs/cgroup/memory/prima-ring-bench")
# The cluster key of every ring here (links are sealed unless a run says --insecure).
KEY = Path(f"/tmp/prima-ring-bench-{os.getpid()}.key")


def key_args(sealed=True):
    return ["--key-file", str(KEY)] if sealed else ["--insecure"]


class Node:
    """A `prima node` on loopback, optionally inside the memory cgroup."""

    def __init__(self, prima, model, threads, mem_budget=None, cgroup_limit=None, sealed=True):
        cmd = [prima, "node", "--listen", "127.0.0.1:0", "-m", str(model), "-t", str(threads)]
        cmd += key_args(sealed)
        if mem_budget:
            cmd += ["--mem-budget", str(mem_budget)]
        if cgroup_limit:
            CGROUP.mkdir(exist_ok=True)
            # Empty the group before changing its limit.
            (CGROUP / "memory.force_empty").write_text("0")
            (CGROUP / "memory.limit_in_bytes").write_text(str(cgroup_limit))
            script = f'echo $$ > {CGROUP}/cgroup.procs && exec "$@"'
            cmd = ["sh", "-c", script, "sh"] + cmd
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.addr = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.match(r"node: listening on (\S+)", line)
            if m:
                self.addr = m.group(1)
                break
        if not self.addr:
            self.stop()
            sys.exit(f"node did not start: {' '.join(cmd)}")
        # Drain stderr in the background so the node never blocks on it.
        import threading

        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def run_prima(prima, model, threads, n, extra, prompt="Once upon a time"):
    cmd = [prima, "run", "-m", str(model), "-t", str(threads), "-p", prompt, "-n", str(n),
           "--temp", "0", "--ignore-eos", "-c", "512"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"prima run failed: {' '.join(cmd)}\n{out.stderr}")
    return float(TPOT.search(out.stderr).group(1)), float(TTFT.search(out.stderr).group(1))


def drop_file_cache(path):
    """Evicts the model file from the page cache (an experiment's cold start)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def overhead(args):
    results = []
    for model in args.models:
        nodes = [Node(args.prima, model, args.threads) for _ in range(2)]
        ring = ",".join(n.addr for n in nodes)
        # 30-layer SmolLM2: 10 layers per device, k = 1.
        windows = args.windows
        single, ringed = [], []
        try:
            for _ in range(args.reps):
                single.append(run_prima(args.prima, model, args.threads, args.n, [])[0])
                ringed.append(run_prima(args.prima, model, args.threads, args.n,
                                        ["--ring", ring, "--windows", windows] + key_args())[0])
        finally:
            for n in nodes:
                n.stop()
        s, r = statistics.median(single), statistics.median(ringed)
        row = {
            "model": Path(model).name,
            "threads": args.threads,
            "single_tpot_ms": s,
            "ring_tpot_ms": r,
            "hops": 3,
            "overhead_per_hop_ms": (r - s) / 3,
            "ring_speed_vs_single": s / r,
            # Each ring run against the single run just before it: less swayed by slow
            # phases of a shared host than the ratio of the two medians.
            "ring_speed_paired_median": statistics.median(a / b for a, b in zip(single, ringed)),
            "single_samples": single,
            "ring_samples": ringed,
        }
        results.append(row)
        print(f"{row['model']:<40} -t {args.threads}: single TPOT {s:.2f} ms, 3-device ring {r:.2f} ms, "
              f"overhead {row['overhead_per_hop_ms']:.3f} ms/hop, ring speed {row['ring_speed_vs_single']:.3f}x single "
              f"(median of paired runs {row['ring_speed_paired_median']:.3f}x)")
    return results


def hop_ms(stats_path):
    """Median per token of the time the activations spend between devices, per hop: the
    head's send and wait (its send returns after device 1 may have started) less every
    node's compute — sealing, sending, waking up and opening."""
    stats = json.loads(stats_path.read_text())
    per_seq = {}
    for dev in stats["devices"]:
        for p in dev["passes"]:
            if p["n_tokens"] != 1:
                continue
            t = per_seq.setdefault(p["seq"], [0.0, 0.0])
            if dev["device"] == 0:
                t[0] += p["send_ms"] + p["wait_ms"]
            else:
                t[1] += p["compute_ms"]
    hops = len(stats["devices"])
    return statistics.median((w - c) / hops for w, c in list(per_seq.values())[1:])


def cpu_ms(pid):
    """User + system CPU time a process has used, in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def secure(args):
    """TPOT and per-hop time of a 3-device loopback ring with sealed links against the same
    ring with plain ones (--insecure), alternating in the same run."""
    results = []
    stats_path = Path("/tmp/prima-ring-bench-secure.json")
    for model in args.models[:1]:
        rings = {}
        for sealed in (True, False):
            nodes = [Node(args.prima, model, args.threads, sealed=sealed) for _ in range(2)]
            rings[sealed] = (nodes, ",".join(n.addr for n in nodes))
        samples = {True: [], False: []}
        hops = {True: [], False: []}
        # The nodes' CPU time per run: unlike TPOT, hardly swayed by other jobs on the host.
        node_cpu = {True: [], False: []}
        try:
            for rep in range(args.reps):
                # Each first in turn, so neither always follows the other's exit.
                for sealed in (False, True) if rep % 2 == 0 else (True, False):
                    before = sum(cpu_ms(n.proc.pid) for n in rings[sealed][0])
                    tpot, _ = run_prima(args.prima, model, args.threads, args.n,
                                        ["--ring", rings[sealed][1], "--windows", args.windows,
                                         "--stats-json", str(stats_path)] + key_args(sealed))
                    samples[sealed].append(tpot)
                    hops[sealed].append(hop_ms(stats_path))
                    node_cpu[sealed].append(sum(cpu_ms(n.proc.pid) for n in rings[sealed][0]) - before)
        finally:
            for nodes, _ in rings.values():
                for n in nodes:
                    n.stop()
        plain, sealed = statistics.median(samples[False]), statistics.median(samples[True])
        row = {
            "model": Path(model).name,
            "threads": args.threads,
            "plain_tpot_ms": plain,
            "sealed_tpot_ms": sealed,
            "sealed_over_plain": sealed / plain,
            "sealed_over_plain_paired_median": statistics.median(
                s / p for s, p in zip(samples[True], samples[False])),
            "plain_hop_ms": statistics.median(hops[False]),
            "sealed_hop_ms": statistics.median(hops[True]),
            "plain_nodes_cpu_ms_per_run": statistics.median(node_cpu[False]),
            "sealed_nodes_cpu_ms_per_run": statistics.median(node_cpu[True]),
            "plain_samples": samples[False],
            "sealed_samples": samples[True],
        }
        results.append(row)
        print(f"{row['model']:<40} -t {args.threads}: TPOT plain {plain:.2f} ms, sealed {sealed:.2f} ms, "
              f"sealed/plain {row['sealed_over_plain']:.3f} (paired median {row['sealed_over_plain_paired_median']:.3f}); "
              f"per hop plain {row['plain_hop_ms']:.3f} ms, sealed {row['sealed_hop_ms']:.3f} ms; "
              f"both nodes' CPU per run (prompt + {args.n} tokens) plain {row['plain_nodes_cpu_ms_per_run']:.0f} ms, "
              f"sealed {row['sealed_nodes_cpu_ms_per_run']:.0f} ms")
    return results


def residency(args):
    model = args.big_model
    results = []
    # (label, windows head,node, prefetch, release)
    plans = [
        ("k=1, no prefetch", f"{args.head_layers},{args.node_layers}", "off", "none"),
        ("k=1, prefetch", f"{args.head_layers},{args.node_layers}", "on", "none"),
        ("k=2, prefetch", f"{args.head_layers // 2},{args.node_layers // 2}", "on", "none"),
        ("k=4, prefetch", f"{args.head_layers // 4},{args.node_layers // 4}", "on", "none"),
        ("k=4, prefetch + MRU release", f"{args.head_layers // 4},{args.node_layers // 4}", "on", "mru"),
    ]
    stats_path = Path("/tmp/prima-ring-bench-stats.json")
    for label, windows, prefetch, release in plans:
        samples = []
        for _ in range(args.reps):
            drop_file_cache(model)
            node = Node(args.prima, model, args.threads, mem_budget=args.mem_budget,
                        cgroup_limit=args.cgroup_limit)
            try:
                tpot, _ = run_prima(args.prima, model, args.threads, args.n,
                                    ["--ring", node.addr, "--windows", windows, "--prefetch", prefetch,
                                     "--release", release, "--release-method", args.release_method,
                                     "--stats-json", str(stats_path)] + key_args())
            finally:
                node.stop()
            stats = json.loads(stats_path.read_text())
            dev = stats["devices"][1]
            per_token = {}
            for p in dev["passes"]:
                if p["n_tokens"] != 1:
                    continue
                t = per_token.setdefault(p["seq"], [0, 0, 0.0])
                t[0] += p["major_faults"]
                t[1] += p["disk_read_bytes"]
                t[2] += p["compute_ms"]
            toks = list(per_token.values())[1:]  # the first decode token still warms up
            samples.append({
                "tpot_ms": tpot,
                "major_faults_per_token": statistics.median(t[0] for t in toks),
                "disk_mb_per_token": statistics.median(t[1] for t in toks) / 1e6,
                "node_compute_ms_per_token": statistics.median(t[2] for t in toks),
                "node_peak_memory_pressure": dev["peak_memory_pressure"],
            })
        row = {"plan": label, "windows": windows}
        for key in samples[0]:
            row[key] = statistics.median(s[key] for s in samples)
        results.append(row)
        print(f"{label:<30} windows {windows:<6} TPOT {row['tpot_ms']:9.1f} ms | node: "
              f"{row['major_faults_per_token']:8.0f} major faults/token, "
              f"{row['disk_mb_per_token']:8.1f} MB read/token, compute {row['node_compute_ms_per_token']:8.1f} ms")
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["overhead", "residency", "secure", "all"])
    p.add_argument("--prima", required=True)
    p.add_argument("--models", nargs="+", default=[])
    p.add_argument("--windows", default="10,10,10")
    p.add_argument("--big-model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("-n", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--head-layers", type=int, default=4)
    p.add_argument("--node-layers", type=int, default=12)
    p.add_argument("--mem-budget", type=int, default=200 << 20)
    p.add_argument("--cgroup-limit", type=int, default=450 << 20)
    p.add_argument("--release-method", default="pageout")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    KEY.unlink(missing_ok=True)
    subprocess.run([args.prima, "keygen", "--out", str(KEY)], check=True, capture_output=True)
    report = {}
    if args.what in ("overhead", "all"):
        report["overhead"] = overhead(args)
    if args.what in ("residency", "all"):
        report["residency"] = residency(args)
    if args.what in ("secure", "all"):
        report["secure"] = secure(args)
    KEY.unlink(missing_ok=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
