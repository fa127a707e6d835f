"""Markdown tables of scripts/bench-streams.sh: python3 streams-report.py OUT_DIR."""
import json
import os
import sys

out = sys.argv[1]


def load(name):
    path = os.path.join(out, name + ".json")
    return json.load(open(path)) if os.path.exists(path) else None


def ms(summary, key):
    v = (summary or {}).get(key)
    return "n/a" if v is None else f"{v:.2f}"


LOADS = [
    ("lat-1", "1 run, 100 events/s"),
    ("lat-50", "50 runs, 200 events/s in total"),
    ("lat-50-fast", "50 runs, 1,000 events/s in total"),
]
rows = [(label, load(name)) for name, label in LOADS if load(name)]
if rows:
    print("Latency, worker publish -> SSE client (ms; one monotonic clock, one process):")
    print()
    print("| load | events | SSE after publish p50 | p90 | p99 | max | SSE after ack p50 | p99 "
          "| core NATS after publish p50 | p99 | added by the service (SSE - NATS) p50 | p99 | max |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in rows:
        s, a, n, d = (r[k] for k in ["sse_after_publish", "sse_after_ack", "nats_after_publish",
                                     "sse_minus_nats"])
        print(f"| {label} | {s['count']} | {ms(s, 'p50_ms')} | {ms(s, 'p90_ms')} | "
              f"{ms(s, 'p99_ms')} | {ms(s, 'max_ms')} | {ms(a, 'p50_ms')} | {ms(a, 'p99_ms')} | "
              f"{ms(n, 'p50_ms')} | {ms(n, 'p99_ms')} | {ms(d, 'p50_ms')} | {ms(d, 'p99_ms')} | "
              f"{ms(d, 'max_ms')} |")
    print()
    print("| load | achieved events/s | publish -> ack p50 | p99 | runs CPU ms/event "
          "| nats-server CPU ms/event | lost on SSE | out of order |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in rows:
        k = r["published"] or 1
        cpu = lambda key: "n/a" if r.get(key) is None else f"{r[key] * 1000 / k:.3f}"
        print(f"| {label} | {r['rate_per_s']:.0f} | {ms(r['publish_to_ack'], 'p50_ms')} | "
              f"{ms(r['publish_to_ack'], 'p99_ms')} | {cpu('runs_cpu_s')} | {cpu('nats_cpu_s')} | "
              f"{r['missing_sse']} | {r['order_errors']} |")
    print()

def fanout_rows(result, label):
    """The rows of an sse-idle result's two fanned-out events (`label` names the event as {what});
    an event none of the streams received shows as 0, n/a."""
    for key, what in (("fanout_live", "a live event"), ("fanout", "the terminal event")):
        f = result.get(key)
        if f:
            print(f"| {label.format(what=what)}: received, p50 / p99 / last (ms) | {f['received']:,}, "
                  f"{ms(f['latency'], 'p50_ms')} / {ms(f['latency'], 'p99_ms')} / {f['last_arrival_ms']:.1f} |")


idle = load("idle")
if idle:
    s = {x["label"]: x for x in idle["samples"]}
    rss = lambda label: s[label]["runs"]["rss_kib"]
    opened = idle["streams_opened"]
    before, held, closed = rss("before"), rss("held"), rss("closed")
    dt = s["held"]["t_s"] - s["opened"]["t_s"]
    cpu_runs = s["held"]["runs"]["cpu_s"] - s["opened"]["runs"]["cpu_s"]
    nats = (s["held"].get("nats_server_cpu_s") or 0) - (s["opened"].get("nats_server_cpu_s") or 0)
    conn = lambda label, key: (s[label].get("runs_nats_connection") or {}).get(key)
    in_msgs = (conn("held", "in_msgs") - conn("opened", "in_msgs")
               if isinstance(conn("held", "in_msgs"), int) and isinstance(conn("opened", "in_msgs"), int)
               else None)
    cons = lambda label: (s[label]["consumers"] or {}).get("total") if isinstance(s[label]["consumers"], dict) else s[label]["consumers"]
    pb, pd = idle["probe_before"]["sse_after_publish"], idle["probe_during"]["sse_after_publish"]
    hb = idle["heartbeats_per_stream"]
    mib = lambda kib: f"{kib / 1024:.1f} MiB"
    print(f"Idle streams: one runs instance, {opened:,} SSE streams on one run, held {idle['held_seconds']:.0f} s:")
    print()
    print("| measure | value |")
    print("|---|---:|")
    print(f"| streams opened (errors) | {opened:,} ({idle['open_errors']}) in {idle['open_seconds']:.1f} s, "
          f"{idle['open_concurrency']} at a time; open p50 {ms(idle['open_latency'], 'p50_ms')} ms, "
          f"p99 {ms(idle['open_latency'], 'p99_ms')} ms |")
    print(f"| alive at the end of the hold | {idle['alive_at_end_of_hold']:,} |")
    print(f"| runs RSS before / holding / after they ended | {mib(before)} / {mib(held)} / {mib(closed)} "
          f"(VmHWM {mib(s['closed']['runs']['hwm_kib'])}) |")
    print(f"| RSS per idle stream | {(held - before) / max(opened, 1):.1f} KiB |")
    bare = load("idle-bare")
    if bare:
        bs = {x["label"]: x for x in bare["samples"]}
        b_before, b_held = bs["before"]["runs"]["rss_kib"], bs["held"]["runs"]["rss_kib"]
        print(f"| baseline: bare axum SSE endpoint, same streams: RSS before / holding, per stream | "
              f"{mib(b_before)} / {mib(b_held)}, {(b_held - b_before) / max(bare['streams_opened'], 1):.1f} KiB |")
        fanout_rows(bare, "baseline: {what} to all of the bare endpoint's streams (one NATS subscription, "
                          "encoded once)")
    floor = load("idle-floor")
    if floor:
        fanout_rows(floor, "floor: {what} to as many streams written from a loop (sse-floor: the kernel "
                           "and the client only)")
    thread = load("idle-thread")
    if thread:
        fanout_rows(thread, "{what} to " + f"{thread['streams_opened']:,} streams of one thread "
                    f"(opened with {thread['open_errors']} errors; its run the active one)")
    many = load("idle-runs")
    if many:
        for key, what in (("fanout_live", "a live event"), ("fanout", "the terminal event")):
            fm = many.get(key)
            if fm:
                print(f"| {what} on each of {many['runs']:,} runs, one stream each ({fm['received']:,} received; "
                      f"publishes took {fm['publish_to_ack_ms']:.0f} ms in all): from its run's publish, "
                      f"p50 / p99 / max (ms) | {ms(fm['latency'], 'p50_ms')} / {ms(fm['latency'], 'p99_ms')} / "
                      f"{ms(fm['latency'], 'max_ms')} |")
    print(f"| runs open fds holding | {s['held']['runs']['fds']:,} |")
    print(f"| runs CPU while holding | {cpu_runs:.2f} s in {dt:.0f} s ({100 * cpu_runs / dt:.1f}% of a core) |")
    print(f"| nats-server CPU while holding | {nats:.2f} s in {dt:.0f} s |")
    if in_msgs is not None:
        print(f"| messages from runs to NATS while holding | {in_msgs:,} ({in_msgs / dt:.0f}/s; "
              f"{in_msgs / max(opened, 1):.2f} per stream) |")
    print(f"| JetStream consumers of the prefix: before / holding | {cons('before')} / {cons('held')} |")
    print(f"| heartbeats per stream (min / median / max) | {hb['min']} / {hb['p50']} / {hb['max']} |")
    print(f"| new run's events, before the streams: SSE after publish p50 / p99 / max (ms) | "
          f"{ms(pb, 'p50_ms')} / {ms(pb, 'p99_ms')} / {ms(pb, 'max_ms')} ({pb['count']} events) |")
    print(f"| the same while holding them | {ms(pd, 'p50_ms')} / {ms(pd, 'p99_ms')} / "
          f"{ms(pd, 'max_ms')} ({pd['count']} events) |")
    fanout_rows(idle, "{what} to all " + f"{opened:,} streams, {idle.get('client', 'http')} client")
    print()
    print("RSS of the runs instance while holding (every 2 s from the end of the opening):")
    print(" ".join(f"{p['t_s']:.0f}s={p['rss_kib'] / 1024:.0f}MiB" for p in idle["timeline"]))

ws, ws_bare = load("ws"), load("ws-bare")
if ws:
    print()
    print(f"Idle WebSockets: a fresh runs instance, {ws['sockets_opened']:,} sockets of `GET /websocket` "
          f"(authenticated by header, sending nothing), held {ws['hold_seconds']} s:")
    print()
    print("| measure | value |")
    print("|---|---:|")
    print(f"| sockets opened (errors) | {ws['sockets_opened']:,} ({ws['open_errors']}) in "
          f"{ws['open_seconds']} s; alive at the end {ws['alive_at_end_of_hold']:,} |")
    print(f"| runs RSS before / holding | {ws['rss_before_kib'] / 1024:.1f} MiB / "
          f"{ws['rss_holding_kib'] / 1024:.1f} MiB |")
    print(f"| RSS per idle WebSocket | {ws['kib_per_socket']} KiB |")
    if ws_bare:
        print(f"| baseline: bare axum WebSocket, same sockets: RSS before / holding, per socket | "
              f"{ws_bare['rss_before_kib'] / 1024:.1f} MiB / {ws_bare['rss_holding_kib'] / 1024:.1f} MiB, "
              f"{ws_bare['kib_per_socket']} KiB |")
    if ws["first_error"]:
        print(f"| first error | {ws['first_error']} |")

for slow in (load("slow"), load("slow-big")):
    if not slow:
        continue
    a, w = slow["alone"], slow["with_slow"]
    print()
    print(f"A slow client: {slow['streams']:,} fast SSE clients of one run ({slow['events']} events of "
          f"~{slow['delta_bytes']} bytes at {slow['rate']:.0f}/s), alone and beside {slow['slow']} client "
          f"that reads nothing (receive buffer 4 KiB) until the run has ended:")
    print()
    print("| measure | alone | beside a slow client |")
    print("|---|---:|---:|")
    for key, name in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")):
        print(f"| fast clients, publish to receipt, {name} (ms) | {ms(a['fast']['latency'], key)} | "
              f"{ms(w['fast']['latency'], key)} |")
    print(f"| fast clients ended / incomplete | {a['fast']['ended']} / {a['fast']['incomplete']} | "
          f"{w['fast']['ended']} / {w['fast']['incomplete']} |")
    print(f"| live events the readers that fell behind skipped (counted once they read again) | {a['skipped_live_events']} | "
          f"{w['skipped_live_events']} |")
    for s_ in w["slow"]:
        print(f"| the slow client, once it reads: events, last id, in order, ended | | {s_['events']}, "
              f"{s_['last_id']}, {s_['in_order']}, {s_['ended']} ({s_['bytes']:,} bytes) |")
    print(f"| p99 beside / alone | | {slow['p99_with_slow_over_alone']} |")
