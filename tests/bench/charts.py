#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Charts of a benchmark result (tests/bench/bench.py --charts DIR).

Reads the JSON line bench.py prints and writes SVG files into DIR:

  throughput.svg  events/s by workers, AMQP and Kafka, against the limits
                  measured in the same run (Postgres, each broker)
  latency.svg     the end-to-end latency distribution at a steady rate,
                  polling and with OUTBOX_LISTEN=on
  dbcost.svg      what draining the outbox costs Postgres per event (WAL
                  bytes, CPU), the relay's variants beside the floor
                  statements measured in the same run

A chart whose sections were not run is left out (and said so on stderr).
Drawn with matplotlib (Debian's python3-matplotlib), no display needed.

Usage: charts.py RESULT_JSON DIR
"""

import json
import os
import sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)

# Fixed so the same result draws the same file.
plt.rcParams["svg.hashsalt"] = "outbox-relay"
plt.rcParams["svg.fonttype"] = "none"


def median(spread):
    """bench.py's spread: {"median": ..., ...}, or a plain number."""
    return spread["median"] if isinstance(spread, dict) else spread


def threshold(doc, name):
    """A target's threshold from the result's own targets table, or, for a
    result without one, from bench.py's (the one place targets are
    written)."""
    targets = doc.get("targets")
    if not isinstance(targets, list):
        import bench  # beside this file; standard library only
        targets = [{"name": n, "threshold": t}
                   for n, _, _, _, t in bench.TARGETS]
    for t in targets:
        if t["name"] == name:
            return t["threshold"]
    return None


def title_of(doc):
    m = doc.get("machine", {})
    return "%s form, %s run(s), %s CPUs" % (doc.get("form", "?"),
                                            doc.get("runs", "?"),
                                            m.get("cpus", "?"))


def throughput(doc, path):
    res = doc["results"]
    tp, lim = res.get("throughput"), res.get("limits")
    if not tp:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    brokers = sorted(tp)
    workers = sorted({int(w) for b in brokers for w in tp[b]})
    width = 0.8 / max(1, len(brokers))
    colors = {"amqp": "#d9822b", "kafka": "#2b6cb0"}
    for i, b in enumerate(brokers):
        xs = [workers.index(int(w)) + (i - (len(brokers) - 1) / 2) * width
              for w in sorted(tp[b], key=int)]
        ys = [median(tp[b][w]["events_per_s"])
              for w in sorted(tp[b], key=int)]
        ax.bar(xs, ys, width * 0.95, label="relay, %s" % b,
               color=colors.get(b))
        for x, y in zip(xs, ys):
            ax.annotate("%.0f" % y, (x, y), ha="center", va="bottom",
                        fontsize=8)
    styles = {"db": ("Postgres limit (lease + mark)", "#555555", "-"),
              "amqp": ("RabbitMQ limit", colors["amqp"], "--"),
              "kafka": ("Kafka test broker limit", colors["kafka"], ":")}
    for k, spread in sorted((lim or {}).items()):
        label, color, style = styles.get(k, (k, "#999999", "-."))
        ax.axhline(median(spread), color=color, linestyle=style,
                   linewidth=1.2, label="%s: %.0f/s" % (label,
                                                        median(spread)))
    ax.set_xticks(range(len(workers)))
    ax.set_xticklabels(["%d" % w for w in workers])
    ax.set_xlabel("relay workers (OUTBOX_WORKERS)")
    ax.set_ylabel("events per second")
    ax.set_title("Throughput against the limits (%s)" % title_of(doc),
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)
    return True


def latency(doc, path):
    res = doc["results"]
    series = [("polling (OUTBOX_POLL_INTERVAL)", res.get("latency"), "#2b6cb0"),
              ("OUTBOX_LISTEN=on", res.get("latency_listen"), "#d9822b")]
    series = [(n, r, c) for n, r, c in series if r and r.get("cdf_ms")]
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, r, color in series:
        cdf = r["cdf_ms"]
        pcts = [100.0 * i / (len(cdf) - 1) for i in range(len(cdf))]
        ax.plot(cdf, pcts, color=color, label="%s: p50 %.1f ms, p99 %.1f ms"
                % (name, median(r["p50"]), median(r["p99"])))
    params = doc.get("parameters", {})
    target = threshold(doc, "latency_1000_polling_p99")
    if target is not None:
        ax.axvline(target, color="#aa0000", linestyle=":", linewidth=1,
                   label="target: p99 within %g ms" % target)
    ax.axhline(99, color="#999999", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency, ms (insert commit to consumer)")
    ax.set_ylabel("events at or below, %")
    ax.set_ylim(0, 100.5)
    ax.set_title("Latency distribution at %s events/s (%s)"
                 % (params.get("latency_rate", "?"), title_of(doc)),
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)
    return True


# (result key, bar label, floor?) in the order the bars are drawn; a
# "+deletes" key adds the deletes of the history (the cleaner's work).
DBCOST_BARS = [
    ("floor_c", "floor C\n(lock, DELETE)", True),
    ("relay_nohistory", "relay\nno history", False),
    ("floor_d", "floor D\n(lock, UPDATE)", True),
    ("relay_history", "relay\nhistory kept", False),
    ("floor_d+deletes", "floor D\n+ its deletes", True),
    ("relay_life+deletes", "relay history\n+ cleaner", False),
    ("relay_ordered", "relay\nordered", False),
]


def dbcost_value(variants, key, measure):
    name, _, deletes = key.partition("+")
    v = variants.get(name)
    if not v:
        return None
    field = ("with_deletes_" + measure) if deletes else measure
    return median(v[field]) if field in v else None


def dbcost(doc, path):
    res = doc["results"].get("dbcost")
    if not res:
        return False
    variants = res["variants"]
    bars = [(label, floor,
             dbcost_value(variants, key, "wal_bytes_per_event"))
            for key, label, floor in DBCOST_BARS]
    cpu = [dbcost_value(variants, key, "cpu_us_per_event")
           for key, _, _ in DBCOST_BARS]
    shown = [i for i, (_, _, wal) in enumerate(bars) if wal is not None]
    if not shown:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, values, unit in ((axes[0], [bars[i][2] for i in shown],
                              "WAL bytes per event"),
                             (axes[1], [cpu[i] for i in shown],
                              "Postgres CPU µs per event")):
        colors = ["#9aa5b1" if bars[i][1] else "#2b6cb0" for i in shown]
        x = range(len(shown))
        ax.bar(x, values, color=colors)
        for xi, v in zip(x, values):
            ax.annotate("%.0f" % v, (xi, v), ha="center", va="bottom",
                        fontsize=7)
        ax.set_xticks(list(x))
        ax.set_xticklabels([bars[i][0] for i in shown], fontsize=7)
        ax.set_ylabel(unit)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_title("Database cost per event: relay (blue) beside the "
                      "floor (grey)", fontsize=10, loc="left")
    axes[1].set_title(title_of(doc), fontsize=9, loc="right")
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)
    return True


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    wrote = []
    for name, draw in (("throughput.svg", throughput),
                       ("latency.svg", latency), ("dbcost.svg", dbcost)):
        path = os.path.join(out, name)
        if draw(doc, path):
            wrote.append(path)
        else:
            print("charts: %s left out: its sections were not run" % name,
                  file=sys.stderr)
    for path in wrote:
        print("charts: wrote %s" % path)
    return 0 if wrote else 1


if __name__ == "__main__":
    sys.exit(main())
