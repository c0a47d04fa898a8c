#!/usr/bin/env python3
"""SWAP bandwidth: how fast parks and restores move one sequence's state of a known size, against
the machine's own copy speed, measured in the same run.

The yardstick is `_core.measure_link_speeds()`: host memcpy between warm buffers, and on a GPU the
pinned device-to-host and host-to-device transfers of one large buffer (with --rpc, the RPC
device's own link). The parks are the server's, on demand, never raced against a request: one
streamed request holds a prompt sized to the target state (its token count from the model's bytes
per cell, measured by parking a short probe and reading `/slots`), and once its first token is out
the bench parks and unparks its slot through the slot API (`POST /slots/0?action=park`, then
`?action=unpark`, then waits for the stream's `: resumed`) a fixed number of times. Every park and
restore logs its bytes and milliseconds; the bench checks that the log holds exactly the parks it
asked for, with the tokens each park's answer named, and nothing else.

One server per flash-attention setting and copy route: our bulk copy (`bulk`) and what shipped
before it, upstream's copy one slice at a time into freshly allocated memory (`slice`,
LLAMA_SERVER_PREEMPT_COPY=slice); flash attention off stores V transposed (one slice per V
element row upstream). The copy guard is off (`--preempt-verify never`: its checks would add an
upstream serialization to the first parks). A slot's first park writes into fresh memory (page
faults on a CPU, a pinned allocation on a GPU); later ones reuse the warm pool, as under repeated
preemption: the table gives the first park apart, and the median and range of the others.

On a device a serving park's logged time ends when its cells are free (the gather is done) and the
transfer to host RAM lands behind it, overlapping the next decodes; the bench sets
LLAMA_SERVER_PREEMPT_SYNC_PARK=1, so every park waits for its transfer and its logged time is the
whole copy. Restores are complete when they return (over RPC: when their bytes
are written to the connection, the RPC backend's synchronize waits for no reply), never uploaded
ahead (a slot parked through the API is not).

    python bench/swap_bandwidth.py                         # SmolLM2-135M on this machine
    python bench/swap_bandwidth.py --model M.gguf --gpu-layers 99 --ctx 32768 --state-mib 64 256 1024 \\
        --slice-max-mib 256 --cell-s 5 --name swap_bandwidth_gpu      # bench/gpu_check.sh's bandwidth phase
    python bench/swap_bandwidth.py --rpc 1 --state-mib 16 64 --name swap_bandwidth_rpc   # KV on a ggml-rpc-server, loopback

Sizes beyond the slot's context (-c, capped by the model's training context) are capped to what
fits, and a size that caps to the same state as a smaller one is skipped; the slice route runs
fewer cycles and is skipped past --slice-max-mib; each cell's cycles stop after --cell-s seconds.
The table says which.

Results: bench/results/NAME.{json,md}.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import requests
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_preempt import _core  # noqa: E402
from llama_preempt.rpc import RpcServer  # noqa: E402
from llama_preempt.server import LlamaServer, ServerConfig  # noqa: E402
from results_io import RESULTS, display_path, md_table, smollm2_model, write_results  # noqa: E402

PARK = re.compile(r"parked by swap \((?P<mib>[\d.]+) MiB, (?P<tokens>\d+) tokens held in (?P<ranges>\d+) cell ranges(?:, \d+ cells freed)?\) "
                  r"in (?P<ms>[\d.]+) ms by (?P<by>[a-z ,]+?), reason: (?P<reason>\w+)")
RESTORE = re.compile(r"restored by swap \((?P<mib>[\d.]+) MiB, (?P<tokens>\d+) tokens\) in (?P<ms>[\d.]+) ms "
                     r"after [\d.]+ ms parked(?P<ahead> \(uploaded ahead\))?")
STAMP = re.compile(r"^(?:\x1b\[[\d;]*m)?(\d+)\.(\d+)\.(\d+)\.(\d+)")   # the log's M.s.ms.us prefix
MIB = 1 << 20
GOAL_MIB = 256.0    # the goal: a bulk park and restore of a 256 MiB state ...
GOAL_PCT = 50.0     # ... at >= 50 % of the link
SLOT = 0            # the held request's slot (id_slot); the second slot stays idle
FILLER = ("the river ran past the old mill and the children played by the water while the baker "
          "sold warm bread to everyone in the small town")


def gbps(mib: float, ms: float) -> float:
    return mib * MIB / (ms / 1e3) / 1e9 if ms > 0 else float("inf")


@dataclass
class Cycle:
    """One park and its restore, as the server logged them and as the client timed them."""
    tokens: int                 # tokens the slot held at the park (the park's answer)
    park_mib: float = 0.0
    park_ms: float = 0.0        # the server's: until the cells were free
    ranges: int = 0
    copied_by: str = ""
    restore_mib: float = 0.0
    restore_ms: float = 0.0     # the server's: the restore is complete when it returns
    ahead: bool = False         # uploaded ahead (its upload untimed; never for an API park)
    client_ms: float = 0.0      # the client's: park request sent to the stream's ": resumed"

    def park_rate(self) -> float:
        """Park GB/s: the state's bytes over the server's logged park time, transfer included."""
        return gbps(self.park_mib, self.park_ms)


@dataclass
class Cell:
    fa: str
    route: str
    target_mib: float
    tokens: int = 0             # prompt tokens asked for
    skipped: str = ""           # why it did not run ("" when it ran)
    note: str = ""              # capped to the slot, or stopped early: why
    prefill_s: float = 0.0
    cycles: list[Cycle] = field(default_factory=list)


class HeldRequest:
    """A streamed completion held in SLOT: the bench parks and unparks it while it generates."""

    def __init__(self, srv: LlamaServer, prompt: list[int], n_predict: int, timeout: float) -> None:
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "ignore_eos": True,
                "cache_prompt": False, "id_slot": SLOT, "stream": True}
        self.resp = requests.post(srv.url + "/completion", json=body, stream=True, timeout=timeout)
        self.resp.raise_for_status()
        self.lines: Iterator[bytes] = self.resp.iter_lines()

    def wait_for(self, prefix: bytes, what: str) -> None:
        """Read the stream until a line that starts with `prefix`; RuntimeError if it ends first."""
        for line in self.lines:
            if line.startswith(prefix):
                return
        raise RuntimeError(f"the held request's stream ended before {what}")

    def close(self) -> None:
        self.resp.close()  # the server sees the closed connection at its next step and frees the slot


def slot_action(srv: LlamaServer, action: str) -> dict[str, Any]:
    r = srv.session.post(f"{srv.url}/slots/{SLOT}?action={action}", timeout=600)
    if r.status_code != 200:
        raise RuntimeError(f"POST /slots/{SLOT}?action={action}: HTTP {r.status_code}: {r.text}")
    return dict(r.json())


def filler_tokens(srv: LlamaServer) -> list[int]:
    r = srv.post("/tokenize", {"content": FILLER})
    r.raise_for_status()
    return [int(t) for t in r.json()["tokens"]]


def prompt_of(tokens: list[int], n: int) -> list[int]:
    return (tokens * (n // len(tokens) + 1))[:n]


def slot_ctx(srv: LlamaServer) -> int:
    """The most tokens one slot may hold (-c, capped by the model's training context)."""
    return int(srv.props()["default_generation_settings"]["n_ctx"])


def probe_bytes_per_token(srv: LlamaServer, filler: list[int], n_tokens: int, timeout: float) -> float:
    """Park a short held request once and read its state's bytes from /slots: bytes per cell."""
    held = HeldRequest(srv, prompt_of(filler, n_tokens), 64, timeout)
    try:
        held.wait_for(b"data:", "its first token")
        parked = slot_action(srv, "park")
        slot = next(s for s in srv.slots() if s["id"] == SLOT)
        n_bytes = int(slot.get("preempt_ram_bytes") or 0)
        slot_action(srv, "unpark")
        held.wait_for(b": resumed", "the probe's restore")
    finally:
        held.close()
    if n_bytes <= 0 or slot.get("preempt_tier") != "ram":
        raise RuntimeError(f"the probe park held no state in RAM (/slots: {slot}): is SWAP available on this model?")
    return n_bytes / int(parked["n_tokens"])


def run_cycles(srv: LlamaServer, cell: Cell, prompt: list[int], n_predict: int, reps: int,
               args: argparse.Namespace) -> None:
    """Hold one request of `prompt`, then park and unpark it `reps` times (fewer past args.cell_s)."""
    t0 = time.perf_counter()
    held = HeldRequest(srv, prompt, n_predict, args.request_timeout)
    try:
        held.wait_for(b"data:", "its first token")
        cell.prefill_s = time.perf_counter() - t0
        t_cycles = time.perf_counter()
        for i in range(reps):
            if i > 0 and time.perf_counter() - t_cycles > args.cell_s:
                cell.note = "; ".join(x for x in (cell.note, f"stopped after {i} of {reps} cycles (--cell-s {args.cell_s:g})") if x)
                break
            c0 = time.perf_counter()
            parked = slot_action(srv, "park")
            if parked.get("preempt_mode") != "swap":
                raise RuntimeError(f"the park went by {parked.get('preempt_mode')}, not swap: {parked}")
            slot_action(srv, "unpark")
            try:
                held.wait_for(b": resumed", "its restore")
            except RuntimeError:
                cell.note = "; ".join(x for x in (cell.note, f"the request ended after {i} of {reps} cycles") if x)
                break
            cell.cycles.append(Cycle(tokens=int(parked["n_tokens"]), client_ms=(time.perf_counter() - c0) * 1e3))
    finally:
        held.close()


def log_events(log: str) -> tuple[list[tuple[int, re.Match[str]]], list[tuple[int, re.Match[str]]]]:
    """The log's park and restore lines, each with its timestamp (µs since the server started)."""
    parks, restores = [], []
    for line in log.splitlines():
        ts = STAMP.match(line)
        t_us = 0 if not ts else ((int(ts[1]) * 60 + int(ts[2])) * 1000 + int(ts[3])) * 1000 + int(ts[4])
        if m := PARK.search(line):
            parks.append((t_us, m))
        elif m := RESTORE.search(line):
            restores.append((t_us, m))
    return parks, restores


def attach_log(cells: list[Cell], log_path: Path, n_probe: int) -> None:
    """The server's park and restore lines, in order, onto the cycles the bench made: exactly one
    park (reason api, holding the tokens the park's answer named) and one restore per cycle, after
    the probe's (`n_probe`: 1 on the server that ran it, else 0)."""
    parks, restores = log_events(log_path.read_text(errors="replace"))
    cycles = [c for cell in cells for c in cell.cycles]
    if len(parks) != len(cycles) + n_probe or len(restores) != len(cycles) + n_probe:
        raise RuntimeError(f"the server logged {len(parks)} swap parks and {len(restores)} swap restores for the "
                           f"bench's {len(cycles) + n_probe} cycles: something else parked, or a restore failed "
                           f"(see {log_path})")
    for c, (_, p), (_, r) in zip(cycles, parks[n_probe:], restores[n_probe:]):
        if p["reason"] != "api" or int(p["tokens"]) != c.tokens or int(r["tokens"]) != c.tokens:
            raise RuntimeError(f"a logged park ({p['tokens']} tokens, reason {p['reason']}) or restore ({r['tokens']} "
                               f"tokens) is not the bench's ({c.tokens} tokens, through the API; see {log_path})")
        c.park_mib, c.park_ms, c.ranges, c.copied_by = float(p["mib"]), float(p["ms"]), int(p["ranges"]), p["by"]
        c.restore_mib, c.restore_ms, c.ahead = float(r["mib"]), float(r["ms"]), bool(r["ahead"])


def run_server(fa: str, route: str, targets: list[float], args: argparse.Namespace, log_dir: Path,
               probe: dict[str, float]) -> list[Cell]:
    """One server for this flash-attention setting and copy route; one held request per size."""
    extra = ["-fa", fa, "--preempt-mode", "swap", "--preempt-ram", "-1", "--preempt-verify", "never"]
    if args.gpu_layers is not None:
        extra += ["-ngl", str(args.gpu_layers)]
    rpcs = [RpcServer(threads=args.threads or 1, log_dir=log_dir).start() for _ in range(args.rpc)]
    if rpcs:
        extra += ["--rpc", ",".join(r.endpoint for r in rpcs), "-ngl", "99"]
    cfg = ServerConfig(model=args.model, n_ctx=args.ctx, n_parallel=2, threads=args.threads, cache_ram_mib=0,
                       extra_args=extra, env={"LLAMA_SERVER_PREEMPT_COPY": route, "LLAMA_SERVER_PREEMPT_SYNC_PARK": "1"})
    cells: list[Cell] = []
    n_probe = 0 if "bytes_per_token" in probe else 1   # the first server measures the bytes per token
    try:
        srv = LlamaServer(cfg, log_dir=log_dir).start(timeout=args.request_timeout)
    except BaseException:
        for r in rpcs:
            r.stop()
        raise
    try:
        filler = filler_tokens(srv)
        n_slot = slot_ctx(srv)
        headroom = max(64, n_slot // 32)   # generated tokens the held request may still take
        if n_probe:
            probe["bytes_per_token"] = probe_bytes_per_token(srv, filler, min(512, n_slot // 4), args.request_timeout)
            probe["slot_ctx"] = n_slot
        per_token = probe["bytes_per_token"]
        done: dict[int, float] = {}
        for target in targets:
            cell = Cell(fa=fa, route=route, target_mib=target)
            cells.append(cell)
            wanted = max(16, round(target * MIB / per_token))
            cell.tokens = min(wanted, n_slot - headroom)
            if cell.tokens < wanted:
                cell.note = f"capped: the slot holds {n_slot} tokens"
            if route == "slice" and target > args.slice_max_mib:
                cell.note = ""
                cell.skipped = f"slice route past --slice-max-mib {args.slice_max_mib:g}"
                continue
            if cell.tokens in done:
                cell.note = ""
                cell.skipped = f"the slot holds {n_slot} tokens: the same state as the {done[cell.tokens]:g} MiB cell"
                continue
            done[cell.tokens] = target
            reps = args.slice_reps if route == "slice" else args.reps
            run_cycles(srv, cell, prompt_of(filler, cell.tokens), n_slot - cell.tokens - 8, reps, args)
    finally:
        srv.stop()
        for r in rpcs:
            r.stop()
    attach_log(cells, srv.log_path, n_probe)
    return cells


def measure_links(n_rpc: int) -> list[tuple[str, str, float, bool]]:
    """The yardstick; with RPC, one RPC server of its own (it serves one client at a time)."""
    if not n_rpc:
        return list(_core.measure_link_speeds(256 << 20, 5))
    with RpcServer() as rpc:
        return list(_core.measure_link_speeds(64 << 20, 5, rpc=[rpc.endpoint]))


def stat(v: list[float]) -> dict[str, float] | None:
    return None if not v else {"median": statistics.median(v), "min": min(v), "max": max(v)}


def summarize(cell: Cell, park_ref: float, restore_ref: float) -> dict[str, Any]:
    """A cell's figures: the first park apart (fresh memory), the median and range of the others."""
    cyc = cell.cycles
    warm = cyc[1:] if len(cyc) > 1 else cyc
    restores = [gbps(c.restore_mib, c.restore_ms) for c in warm if not c.ahead]
    park, restore = stat([c.park_rate() for c in warm]), stat(restores)
    return {
        "fa": cell.fa, "route": cell.route, "target_mib": cell.target_mib, "tokens": cell.tokens,
        "skipped": cell.skipped, "note": cell.note, "n_cycles": len(cyc), "prefill_s": cell.prefill_s,
        "mib": stat([c.park_mib for c in cyc]), "ranges": stat([float(c.ranges) for c in cyc]),
        "copied_by": sorted({c.copied_by for c in cyc}),
        "n_ahead": sum(c.ahead for c in cyc),
        "first_park_gbps": cyc[0].park_rate() if cyc else None,
        "first_restore_gbps": gbps(cyc[0].restore_mib, cyc[0].restore_ms) if cyc else None,
        "park_gbps": park, "restore_gbps": restore,
        "park_pct_of_link": None if not park else 100 * park["median"] / park_ref,
        "restore_pct_of_link": None if not restore else 100 * restore["median"] / restore_ref,
    }


def fmt_stat(s: dict[str, float] | None, digits: int = 2) -> str:
    if not s:
        return "-"
    if s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}%"


def goal_lines(rows: list[dict[str, Any]], yardstick: str) -> list[str]:
    """Met / not met for the bulk cell nearest GOAL_MIB, per flash-attention setting."""
    out = []
    for fa in dict.fromkeys(r["fa"] for r in rows):
        run = [r for r in rows if r["fa"] == fa and r["route"] == "bulk" and r["n_cycles"] and r["mib"]]
        if not run:
            out.append(f"goal (bulk park and restore of {GOAL_MIB:g} MiB at >= {GOAL_PCT:g} % of the {yardstick}), "
                       f"fa {fa}: no bulk cell ran")
            continue
        r = min(run, key=lambda x: abs(x["mib"]["median"] - GOAL_MIB))
        park, restore = r["park_pct_of_link"], r["restore_pct_of_link"]
        met = park is not None and restore is not None and park >= GOAL_PCT and restore >= GOAL_PCT
        verdict = "met" if met else "not met"
        out.append(f"goal (bulk park and restore of {GOAL_MIB:g} MiB at >= {GOAL_PCT:g} % of the {yardstick}), fa {fa}: "
                   f"nearest cell {r['mib']['median']:.1f} MiB: park {pct(park)}"
                   f", restore {pct(restore)}: {verdict}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="any gguf (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--gpu-layers", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rpc", type=int, default=0, metavar="N",
                    help="keep the model and KV cache on N ggml-rpc-servers over loopback (-ngl 99)")
    ap.add_argument("--ctx", type=int, default=8192, help="-c: the pool; one slot holds at most this "
                    "(and the model's training context)")
    ap.add_argument("--state-mib", type=float, nargs="+", default=[64, 256, 1024],
                    help="the states to park, MiB (default 64 256 1024; capped to what one slot holds)")
    ap.add_argument("--reps", type=int, default=8, help="park/restore cycles per cell, bulk route (default 8)")
    ap.add_argument("--slice-reps", type=int, default=3, help="cycles per cell, slice route (default 3)")
    ap.add_argument("--slice-max-mib", type=float, default=64,
                    help="the slice route skips larger states (default 64)")
    ap.add_argument("--cell-s", type=float, default=15, help="a cell's cycles stop after this many seconds "
                    "(at least one cycle; default 15)")
    ap.add_argument("--request-timeout", type=float, default=600, help="seconds to wait for a server or a prompt")
    ap.add_argument("--fa", nargs="+", default=["on", "off"])
    ap.add_argument("--routes", nargs="+", default=["bulk", "slice"], choices=["bulk", "slice", "graph"],
                    help="copy routes (LLAMA_SERVER_PREEMPT_COPY; graph: host tensors through the device path too)")
    ap.add_argument("--log-dir", type=Path, default=None, help="keep the servers' logs here (default: a temporary directory)")
    ap.add_argument("--name", default="swap_bandwidth")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=200)  # a log file gets the whole table

    args.model = smollm2_model(args.model)

    links = [{"device": d, "what": w, "gbps": g, "pinned": p} for d, w, g, p in measure_links(args.rpc)]
    memcpy = next(link["gbps"] for link in links if link["what"] == "memcpy")
    d2h = next((link["gbps"] for link in links if link["what"] == "device_to_host"), None)
    h2d = next((link["gbps"] for link in links if link["what"] == "host_to_device"), None)
    on_device = bool((args.gpu_layers or args.rpc) and d2h and h2d)
    park_ref, restore_ref = (d2h, h2d) if on_device and d2h and h2d else (memcpy, memcpy)
    yardstick = ("RPC device-to-host / host-to-device over loopback" if args.rpc and on_device
                 else "pinned device-to-host / host-to-device" if on_device else "host memcpy")
    console.print(f"yardstick ({yardstick}): park {park_ref:.2f} GB/s, restore {restore_ref:.2f} GB/s; "
                  + ", ".join(f"{x['device']} {x['what']} {x['gbps']:.2f} GB/s" for x in links))

    t0 = time.perf_counter()
    cells: list[Cell] = []
    probe: dict[str, float] = {}
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="swap_bandwidth_"))  # the servers' logs, parsed
    log_dir.mkdir(parents=True, exist_ok=True)
    for fa in args.fa:
        for route in args.routes:
            console.print(f"[bold]fa {fa}, {route} copy[/]")
            cells += run_server(fa, route, args.state_mib, args, log_dir, probe)
            if len(cells) == len(args.state_mib):
                console.print(f"{probe['bytes_per_token'] / 1024:.2f} KiB per token (probe park); "
                              f"a slot holds {probe['slot_ctx']:.0f} tokens")
    elapsed = time.perf_counter() - t0
    rows = [summarize(c, park_ref, restore_ref) for c in cells]

    headers = ["flash attn", "copy", "state MiB (target)", "tokens", "cycles", "copied by",
               "first park GB/s", "park GB/s med (range)", "park % of link",
               "restore GB/s med (range)", "restore % of link", "note"]

    def note(r: dict[str, Any]) -> str:
        parts = [r["skipped"] or r["note"]]
        if r["n_ahead"]:
            parts.append(f"{r['n_ahead']} restores uploaded ahead, left out")
        return "; ".join(p for p in parts if p)

    table_rows = [[r["fa"], r["route"],
                   f"{r['mib']['median']:.{1 if r['mib']['median'] >= 10 else 2}f} ({r['target_mib']:g})"
                   if r["mib"] else f"- ({r['target_mib']:g})",
                   r["tokens"], r["n_cycles"], ", ".join(r["copied_by"]) or "-",
                   "-" if r["first_park_gbps"] is None else f"{r['first_park_gbps']:.2f}",
                   fmt_stat(r["park_gbps"]), pct(r["park_pct_of_link"]),
                   fmt_stat(r["restore_gbps"]), pct(r["restore_pct_of_link"]), note(r)] for r in rows]
    goals = goal_lines(rows, yardstick)
    t = Table(title=f"SWAP bandwidth, {args.model.name}, one held request parked through the slot API "
                    f"(yardstick: {yardstick} {park_ref:.1f} / {restore_ref:.1f} GB/s)", title_justify="left")
    for h in headers:
        t.add_column(h, justify="left" if h == "note" else "right")
    for row in table_rows:
        t.add_row(*[str(c) for c in row])
    console.print(t)
    for g in goals:
        console.print(g)

    command = "python bench/swap_bandwidth.py" + ("" if len(sys.argv) < 2 else " " + " ".join(sys.argv[1:]))
    md = [f"SWAP park and restore bandwidth, {args.model.name}: one request held per state size (prompt tokens "
          f"from {probe.get('bytes_per_token', 0) / 1024:.2f} KiB per token, measured by a probe park), parked and "
          f"unparked through the slot API {args.reps} times (slice route {args.slice_reps}, skipped past "
          f"{args.slice_max_mib:g} MiB; cycles stop after {args.cell_s:g} s), -c {args.ctx} (a slot holds "
          f"{probe.get('slot_ctx', 0):.0f} tokens), --preempt-verify never. First park: each cell's first (into fresh "
          "memory, unless the warm pool holds enough); median (range): its later cycles.", "",
          f"Yardstick, measured by the same script: {yardstick}, park {park_ref:.2f} GB/s, restore "
          f"{restore_ref:.2f} GB/s (" + ", ".join(f"{x['device']} {x['what']} {x['gbps']:.2f}" for x in links) + ").",
          "", *md_table(headers, table_rows), "", *[f"- {g}" for g in goals], "",
          f"Command: `{command}` ({elapsed:.0f} s)."]
    write_results(args.name, {"model": display_path(args.model), "links": links, "yardstick": yardstick,
                              "park_ref_gbps": park_ref, "restore_ref_gbps": restore_ref, "probe": probe,
                              "args": {k: (display_path(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                              "summary": rows, "goal": goals, "cells": [asdict(c) for c in cells],
                              "elapsed_s": elapsed}, md, args.out)
    console.print(f"wrote {args.out / (args.name + '.md')} ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
