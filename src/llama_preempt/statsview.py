"""What a running server is doing now: its slots, the preemption counters and their rates, the host
RAM parked slots hold against the budget and the disk tier's files (`llama-preempt stats URL`)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import requests
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .metrics import MetricsFormatError, parse_prometheus
from .probe import NothingAnswers, NotLlamaServer, ServerURLError, get, llama_server_props, server_url
from .stats import COUNTERS, PreemptStats


class StatsError(RuntimeError):
    pass


@dataclass(frozen=True)
class Snapshot:
    url: str
    t: float                       # time.monotonic() when taken
    stats: PreemptStats
    series: dict[str, float] = field(default_factory=dict)  # every unlabeled llamacpp:* value
    budget_mib: int | None = None  # --preempt-ram, when the server says (/props)
    disk_dir: str | None = None    # --preempt-disk (/props), None: no disk tier
    disk_mib: int | None = None    # --preempt-disk-mib (/props)
    version: str | None = None
    active: bool | None = None     # preemption configured and able to work (/props), None: not said
    inactive_reason: str | None = None
    compress: str | None = None    # --preempt-compress (/props): "q8_0" offers the compressed tier


def fetch(url: str, session: requests.Session | None = None, timeout: float = 5.0) -> Snapshot:
    """One snapshot of the server at url (`host:port` or a URL); StatsError with what to do when it
    cannot be had: nothing answers there, something that is not llama-server does, or llama-server
    without --metrics or --slots."""
    s = session or requests.Session()
    try:
        base = server_url(url)
        m = get(s, base, "/metrics", timeout)
        if m.status_code != 200:
            llama_server_props(s, base, timeout)  # says when it is not llama-server at all
    except (ServerURLError, NothingAnswers, NotLlamaServer) as e:
        raise StatsError(str(e)) from None
    if m.status_code in (404, 501):
        raise StatsError(f"llama-server at {base} has no /metrics: start it with --metrics")
    if m.status_code != 200:
        raise StatsError(f"{base}/metrics answered {m.status_code}: {m.text[:200]}")
    try:
        snap = parse_prometheus(m.text)
    except MetricsFormatError as e:
        raise StatsError(f"{base}/metrics is not llama-server's metrics text ({e})") from None
    if "n_preempt_total" not in snap:
        raise StatsError(f"{base} shows no preemption metrics: it is not llama-preempt's llama-server "
                         f"(a stock llama.cpp server?); run `llama-preempt serve ...` instead")
    sl = s.get(base + "/slots", timeout=timeout)
    if sl.status_code in (404, 501):
        raise StatsError(f"llama-server at {base} has no /slots: start it with --slots (it is on by default)")
    if sl.status_code != 200:
        raise StatsError(f"{base}/slots answered {sl.status_code}: {sl.text[:200]}")
    props: dict[str, Any] = {}
    try:
        props = dict(s.get(base + "/props", timeout=timeout).json().get("llama_preempt", {}))
    except (requests.RequestException, ValueError, AttributeError, TypeError):
        pass
    values = {name: metric.value for name, metric in snap.metrics.items()}
    stats = PreemptStats.from_series(values, list(sl.json()), snap.labeled)
    return Snapshot(base, time.monotonic(), stats, values, props.get("preempt_ram_mib"), props.get("preempt_disk"),
                    props.get("preempt_disk_mib"), props.get("version"), props.get("preempt_active"),
                    props.get("preempt_inactive_reason"), props.get("preempt_compress"))


def rates(prev: Snapshot | None, cur: Snapshot) -> dict[str, float] | None:
    """Per-second rates of the preemption counters between two snapshots."""
    if prev is None or cur.t <= prev.t:
        return None
    dt = cur.t - prev.t
    return {n: (getattr(cur.stats, n) - getattr(prev.stats, n)) / dt for n in COUNTERS}


def _parks_cap_bytes(snap: Snapshot) -> int | None:
    """What parked slots may hold now: --preempt-ram within the host budget in force (--host-kv-ram);
    -1 no limit, None when the server did not say."""
    ram = _budget_bytes(snap.budget_mib)
    if ram is None:
        return None
    caps = [c for c in (ram, snap.stats.preempt_host_budget_bytes or -1) if c >= 0]
    return min(caps) if caps else -1


def _budget_bytes(mib: int | None) -> int | None:
    """A budget flag in MiB (-1: no limit) as bytes (-1 kept); None when the server did not say."""
    return None if mib is None else (-1 if mib < 0 else mib << 20)


def to_json(snap: Snapshot, r: dict[str, float] | None) -> dict[str, Any]:
    st = snap.stats
    return {
        "url": snap.url,
        "version": snap.version,
        "preempt_active": snap.active,
        "preempt_inactive_reason": snap.inactive_reason,
        "counters": {n: getattr(st, n) for n in COUNTERS},
        "rates_per_s": r,
        "requests_preempted": st.requests_preempted,
        # --prefix-share: prompts that linked another slot's cells, the tokens they did not evaluate, the cells held once
        "prefix": {"links": st.n_prefix_links_total, "tokens_linked": st.n_prompt_tokens_linked_total,
                   "cells_saved": st.kv_pool_cells_saved},
        # the decode width (--preempt-sched width-loss): who decodes now, and the step cost it is chosen by
        "decode": {"width": st.preempt_decode_width, "paused": st.requests_paused,
                   "step_fixed_ns": st.preempt_step_fixed_ns, "step_decode_token_ns": st.preempt_step_decode_token_ns,
                   "step_prompt_token_ns": st.preempt_step_prompt_token_ns,
                   "step_attend_kcell_ns": st.preempt_step_attend_kcell_ns, "samples": st.preempt_step_cost_samples},
        # parked slots: what they hold, and their share of the host budget in force
        "ram": {"held_bytes": st.preempt_ram_bytes, "budget_bytes": _parks_cap_bytes(snap)},
        # --host-kv-ram: parked slots and upstream's prompt cache under one budget (0: no limit)
        "host": {"budget_bytes": st.preempt_host_budget_bytes, "parked_bytes": st.preempt_ram_bytes,
                 "prompt_cache_bytes": st.prompt_cache_bytes},
        "prompt_cache": {"ram_bytes": st.prompt_cache_bytes, "disk_bytes": st.prompt_cache_disk_bytes,
                         "evicted_for_parks": st.n_prompt_cache_evicted_total,
                         "spilled_to_disk": st.n_prompt_cache_spilled_total,
                         "disk_hits": st.n_prompt_cache_disk_hits_total,
                         "disk_failures": st.n_prompt_cache_disk_failures_total,
                         "disk_skipped": st.n_prompt_cache_disk_skipped_total,
                         "streamed_to_disk": st.n_prompt_cache_streamed_total,
                         "streamed_back": st.n_prompt_cache_streamed_back_total},
        "disk": None if snap.disk_dir is None else {
            "dir": snap.disk_dir, "held_bytes": st.preempt_disk_bytes,
            "prompt_cache_bytes": st.prompt_cache_disk_bytes, "budget_bytes": _budget_bytes(snap.disk_mib),
            "writes_in_flight": st.preempt_disk_writes_in_flight,
            "write_bytes_per_second": st.preempt_disk_write_bytes_per_second,
            "read_bytes_per_second": st.preempt_disk_read_bytes_per_second,
            "failures": dict(st.disk_failures)},
        # the compressed tier (--preempt-compress q8_0): its measured rates and packed share, its price
        "ram_q8": None if snap.compress != "q8_0" else {
            "pack_bytes_per_second": st.preempt_ram_q8_pack_bytes_per_second,
            "unpack_bytes_per_second": st.preempt_ram_q8_unpack_bytes_per_second,
            "packed_percent": st.preempt_ram_q8_packed_percent},
        "tiers": {"parks": dict(st.parks_by_tier), "restores": dict(st.restores_by_tier)},
        "requests_processing": snap.series.get("requests_processing"),
        "choice": {"parks_by_choice": dict(st.parks_by_choice),
                   "park_bytes_per_second": st.park_bytes_per_second,
                   "restore_bytes_per_second": st.restore_bytes_per_second,
                   "prefill_tokens_per_second": st.prefill_tokens_per_second,
                   "copies_in_flight": st.preempt_copies_in_flight},
        "slots": [s.__dict__ for s in st.slots],
    }


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def render(snap: Snapshot, r: dict[str, float] | None) -> Group:
    st = snap.stats
    slots = Table(title=f"{snap.url}  ({snap.version or 'llama-preempt'})", title_justify="left")
    # short headers: the table reads whole at 80 columns (README: "held" is tokens held, "mode" how it
    # is parked: swap (to RAM), disk, recompute or another tier by its name (ram_q8), "recomp" tokens recomputed, "parked" the time
    # parked, the current park included)
    for col in ("slot", "state", "held", "mode", "parks", "recomp", "RAM/disk", "parked"):
        slots.add_column(col, justify="right" if col not in ("state", "mode") else "left", no_wrap=True)
    for s in st.slots:
        state = {"preempted": "[yellow]parked[/]", "generating": "[green]generating[/]", "paused": "[blue]paused[/]",
                 "processing_prompt": "[cyan]prompt[/]", "started": "[cyan]started[/]"}.get(s.state, s.state)
        held = " + ".join(x for x in (_mib(s.preempt_ram_bytes) if s.preempt_ram_bytes else "",
                                      f"{_mib(s.preempt_disk_bytes)} disk" if s.preempt_disk_bytes else "") if x)
        mode = {"ram": "swap"}.get(s.preempt_tier or "", s.preempt_tier or "")  # where it waits, by its tier's name
        slots.add_row(str(s.id), state, str(s.n_tokens), mode, str(s.n_preempt),
                      str(s.n_recompute), held, f"{s.t_preempted_ms / 1000:.1f} s" if s.t_preempted_ms else "")
    counters = Table(title="preemption", title_justify="left")
    counters.add_column("counter")
    counters.add_column("total", justify="right")
    counters.add_column("per s", justify="right")
    for n in COUNTERS:
        if snap.disk_dir is None and n.startswith("n_disk_"):
            continue  # no disk tier: nothing to count
        counters.add_row(n, str(getattr(st, n)), "" if r is None else f"{r[n]:.2f}")
    cap = _parks_cap_bytes(snap)
    parks = ("no limit" if cap is not None and cap < 0 else "recompute only" if cap == 0 else
             _mib(cap) if cap is not None else "unknown")
    counters.add_row("requests parked now", str(st.requests_preempted), "")
    # the decode width: the oldest generating slots decode, the rest pause (--preempt-sched width-loss)
    counters.add_row("decoding / paused now", f"{st.preempt_decode_width} / {st.requests_paused}", "")
    if st.n_prefix_links_total or st.kv_pool_cells_saved:
        # --prefix-share: the cells shared prefixes would take more as copies (the links are counters above)
        counters.add_row("cells shared prefixes save now", str(st.kv_pool_cells_saved), "")
    if st.preempt_step_cost_samples:
        # two rows, so that the table still reads whole at 80 columns
        counters.add_row("step cost (fitted)", f"{st.preempt_step_fixed_ns / 1e6:.1f} ms + "
                         f"{st.preempt_step_decode_token_ns / 1e6:.1f} ms/token", "")
        counters.add_row("  + per cell attended", f"{st.preempt_step_attend_kcell_ns / 1e6:.1f} us", "")
    host = _mib(st.preempt_host_budget_bytes) if st.preempt_host_budget_bytes else "no limit"
    # the one host budget in force (--host-kv-ram) by kind: parked slots come first (up to their
    # share), cached prompts give way
    counters.add_row("host KV: parked + prompts / budget",
                     f"{_mib(st.preempt_ram_bytes)} + {_mib(st.prompt_cache_bytes)} / {host}", "")
    counters.add_row("  parked slots may hold", parks, "")
    counters.add_row("swap park / restore rate", f"{st.park_bytes_per_second / 1e9:.2f} / "
                     f"{st.restore_bytes_per_second / 1e9:.2f} GB/s", "")
    counters.add_row("prefill rate (recompute)", f"{st.prefill_tokens_per_second:.0f} tokens/s", "")
    if snap.compress == "q8_0":
        counters.add_row("ram_q8 pack / unpack rate, packed", f"{st.preempt_ram_q8_pack_bytes_per_second / 1e9:.2f} / "
                         f"{st.preempt_ram_q8_unpack_bytes_per_second / 1e9:.2f} GB/s, "
                         f"{st.preempt_ram_q8_packed_percent} % of the state", "")
    if snap.disk_dir is not None:
        disk_budget = "the disk's free space" if snap.disk_mib is None or snap.disk_mib < 0 else f"{snap.disk_mib} MiB"
        counters.add_row("disk held / budget", f"{_mib(st.preempt_disk_bytes)} / {disk_budget}"
                         + (f", {st.preempt_disk_writes_in_flight} writing" if st.preempt_disk_writes_in_flight else ""), "")
        counters.add_row("disk write / read rate", f"{st.preempt_disk_write_bytes_per_second / 1e9:.2f} / "
                         f"{st.preempt_disk_read_bytes_per_second / 1e9:.2f} GB/s", "")
        if st.prompt_cache_disk_bytes or st.n_prompt_cache_spilled_total or st.n_prompt_cache_disk_skipped_total:
            counters.add_row("  of it cached prompts", _mib(st.prompt_cache_disk_bytes), "")
            counters.add_row("prompts to disk / back / failed / dropped",
                             f"{st.n_prompt_cache_spilled_total} / {st.n_prompt_cache_disk_hits_total} / "
                             f"{st.n_prompt_cache_disk_failures_total} / {st.n_prompt_cache_disk_skipped_total}", "")
            if st.n_prompt_cache_streamed_total or st.n_prompt_cache_streamed_back_total:
                counters.add_row("  larger than the RAM cache: streamed to disk / back",
                                 f"{st.n_prompt_cache_streamed_total} / {st.n_prompt_cache_streamed_back_total}", "")
        failed = ", ".join(f"{k} {v}" for k, v in st.disk_failures.items() if v)
        counters.add_row("disk failures (recomputed)", failed or "none", "")
    if st.n_prompt_cache_evicted_total:
        counters.add_row("cached prompts given way to parks", str(st.n_prompt_cache_evicted_total), "")
    chosen = ", ".join(f"{k} {v}" for k, v in st.parks_by_choice.items() if v)
    counters.add_row("parks by choice", chosen or "none yet", "")
    tiers = ", ".join(f"{k} {v}" for k, v in st.parks_by_tier.items() if v)
    back = ", ".join(f"{k} {v}" for k, v in st.restores_by_tier.items() if v)
    counters.add_row("parks / resumes by tier", f"{tiers or 'none yet'} / {back or 'none yet'}", "")
    if snap.active is False:  # said first: nothing below will move while it is off
        return Group(Text(f"preemption INACTIVE: {snap.inactive_reason}", style="bold red"), slots, counters)
    return Group(slots, counters)
