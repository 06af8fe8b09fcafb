#!/usr/bin/env python3
"""Plot sdpa-bench rows (and PyTorch rows of compare_torch.py) into one PNG.

    /usr/bin/python3 bench/plot.py results/sdpa_bench.csv [results/torch.csv] out.png

Left panel: prefill shapes, dense-equivalent GFLOP/s (4*B*H*L*S*E / t) per shape, one series
per implementation (BLAS floor, reference, tiled, AUTO at each thread count, PyTorch default,
PyTorch best). Right panel: decode shapes, GB/s of K and V read (bandwidth floor, reference,
tiled, decode, AUTO, PyTorch default and best).
"""
import csv
import sys


def _f(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def _bench_series(bench_rows, path, n, field):
    out = {}
    for r in bench_rows:
        if r["path"] == path and int(r["threads"]) == n and r["status"] == "ok":
            out[r["shape"]] = _f(r[field])
    return out


def _torch_series(torch_rows, which, field):
    """which = 'default': fastest formulation at the default setting; 'best': fastest overall."""
    best = {}
    for r in torch_rows:
        if which == "default" and r["setting"] != "default":
            continue
        ms = float(r["median_ms"])
        if r["shape"] not in best or ms < best[r["shape"]][0]:
            best[r["shape"]] = (ms, _f(r[field]))
    return {k: v[1] for k, v in best.items()}


def _short(name):
    kind, dims = name.split("-", 1)
    return f"{kind}\n{dims}"


def plot(bench_rows, torch_rows, out_png, threads):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    shapes = []
    for r in bench_rows:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
    prefill = [s for s in shapes if int(next(r["L"] for r in bench_rows if r["shape"] == s)) > 4]
    decode = [s for s in shapes if s not in prefill]

    series = []  # (label, {shape: value}, style)
    styles = {"blas-floor": ("k", "s"), "reference": ("tab:gray", "o"), "tiled": ("tab:blue", "^"),
              "decode": ("tab:purple", "v"), "auto": ("tab:green", "D"), "bw-floor": ("k", "s")}

    def add_bench(path, label, field):
        for i, n in enumerate(threads):
            color, marker = styles[path]
            series.append((f"{label} {n}t", _bench_series(bench_rows, path, n, field),
                           dict(color=color, marker=marker, linestyle="none",
                                fillstyle="full" if i == len(threads) - 1 else "none")))

    fig, axes = plt.subplots(1, 2, figsize=(17, 8.5), gridspec_kw={"width_ratios": [max(len(prefill), 1),
                                                                                   max(len(decode), 1) + 1]})
    for ax, group, field, ylabel, paths in (
            (axes[0], prefill, "gflops_dense", "GFLOP/s (dense-equivalent, 4·B·H·L·S·E / t)",
             [("blas-floor", "BLAS floor"), ("reference", "reference"), ("tiled", "tiled"), ("auto", "AUTO")]),
            (axes[1], decode, "gbps", "GB/s (K and V bytes / t)",
             [("bw-floor", "bandwidth floor"), ("reference", "reference"), ("tiled", "tiled"),
              ("decode", "decode"), ("auto", "AUTO")])):
        series.clear()
        for path, label in paths:
            add_bench(path, label, field)
        if torch_rows:
            series.append(("PyTorch default", _torch_series(torch_rows, "default", field),
                           dict(color="tab:red", marker="x", linestyle="none", markersize=8)))
            series.append(("PyTorch best", _torch_series(torch_rows, "best", field),
                           dict(color="tab:orange", marker="*", linestyle="none", markersize=11)))
        xs = list(range(len(group)))
        width = 0.6  # series are spread side by side within a shape so that equal values stay visible
        for si, (label, data, style) in enumerate(series):
            dx = (si / max(len(series) - 1, 1) - 0.5) * width
            pts = [(x + dx, data.get(s)) for x, s in zip(xs, group) if data.get(s)]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
        ax.set_xticks(xs)
        ax.set_xticklabels([_short(s) for s in group], fontsize=8)
        ax.set_xlim(-0.6, len(group) - 0.4)
        for x in xs[1:]:
            ax.axvline(x - 0.5, color="0.85", linewidth=0.8)
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.12), ncol=4, frameon=False)
    axes[0].set_title("prefill / cross / memory shapes (B x H x L x S x E)")
    axes[1].set_title("decode shapes (L = 1)")
    core = next((r.get("blas_core") for r in bench_rows if r.get("blas_core")), "?")
    fig.suptitle("libsdpa sdpa-bench vs floors and PyTorch; medians, higher is better; "
                 f"OpenBLAS core {core}; filled markers: {max(threads)} threads, hollow: fewer")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    with open(sys.argv[1], newline="") as f:
        bench_rows = list(csv.DictReader(f))
    torch_rows = []
    if len(sys.argv) == 4:
        with open(sys.argv[2], newline="") as f:
            torch_rows = list(csv.DictReader(f))
    threads = sorted({int(r["threads"]) for r in bench_rows})
    plot(bench_rows, torch_rows, sys.argv[-1], threads)


if __name__ == "__main__":
    main()
