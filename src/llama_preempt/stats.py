"""Preemption statistics: one type for the in-process Engine and for a server over HTTP.

`Engine.stats()` reads them directly from the slots; `LlamaServer.preempt_stats()` (and
`llama_preempt.metrics.parse_preempt_stats`) builds the same dataclass from `/metrics` and `/slots`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import _core

# the preemption series of /metrics (without the "llamacpp:" prefix), as the server reports them:
# read from the compiled core, never re-listed here
SERIES: tuple[tuple[str, str], ...] = tuple(_core.metric_names())  # (name, "counter" | "gauge")
COUNTERS = tuple(n for n, kind in SERIES if kind == "counter")
GAUGES = tuple(n for n, kind in SERIES if kind == "gauge")
# --preempt-mode: how a victim is parked (auto: the cheaper of SWAP and RECOMPUTE by measured cost)
PREEMPT_MODES: tuple[str, ...] = tuple(_core.PREEMPT_MODES)
# why a victim was parked by SWAP or RECOMPUTE: the `choice` labels of preempt_parks_by_choice_total
PARK_CHOICES: tuple[str, ...] = tuple(_core.PARK_CHOICES)
# where a parked slot's state waits: the `tier` labels of preempt_parks_by_tier_total (ram, disk, recompute)
PARK_TIERS: tuple[str, ...] = tuple(_core.PARK_TIERS)
# what failed in a disk park: the `kind` labels of preempt_disk_failures_total
DISK_FAILURES: tuple[str, ...] = tuple(_core.DISK_FAILURES)
# the counters with one label, as the server reports them: (name, label) -> the PreemptStats field
# holding them, the name without "preempt_" and "_total" (preempt_parks_by_tier_total: parks_by_tier)
LABELED: tuple[tuple[str, str], ...] = tuple(_core.labeled_metric_names())


def labeled_field(name: str) -> str:
    """The PreemptStats field of a labeled series: preempt_parks_by_choice_total -> parks_by_choice."""
    return name.removeprefix("preempt_").removesuffix("_total")


@dataclass(frozen=True)
class SlotStats:
    """One slot as the planner sees it."""

    id: int
    state: str               # idle, started, processing_prompt, generating, preempted, ...
    is_processing: bool
    is_preempted: bool
    preempt_mode: str | None  # "swap" or "recompute" while parked (from preempt_tier; kept for earlier releases)
    n_tokens: int            # cells the slot holds in the pool (0 while parked)
    n_decoded: int           # tokens generated for its request so far
    n_preempt: int           # times its request was parked
    n_recompute: int         # tokens re-prefilled for its request
    preempt_ram_bytes: int   # host RAM its parked state holds
    t_preempted_ms: float    # time its request spent parked
    id_cmpl: str | None = None  # the "id" of its request's OpenAI-style responses
    priority: int = 0           # its request's priority
    preempt_choice: str | None = None  # while parked: why by SWAP or RECOMPUTE (a `choice` label of /metrics)
    preempt_copy_in_flight: bool = False  # while parked by SWAP: its copy to host RAM may still run
    preempt_tier: str | None = None     # while parked: where its state waits, "ram", "disk", "recompute" or "ram_q8"
    preempt_disk_bytes: int = 0         # bytes of its state in a file of the disk tier now
    is_paused: bool = False             # generating beyond the decode width: it keeps its cells and waits for a seat
    n_cells_shared: int = 0             # of its cells, those another slot holds too (a linked prefix, an n_cmpl family's prompt): a park frees the rest

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SlotStats":
        """From a /slots entry (which nests n_decoded in next_token)."""
        n_decoded = d.get("n_decoded")
        if n_decoded is None:
            nt = d.get("next_token") or [{}]
            n_decoded = nt[0].get("n_decoded", 0) if d.get("is_processing") else 0
        n_tokens = d.get("n_tokens", d.get("n_prompt_tokens", 0))
        state = d.get("state") or ("preempted" if d.get("is_preempted") else
                                   "processing" if d.get("is_processing") else "idle")
        return cls(
            id=int(d["id"]),
            state=str(state),
            is_processing=bool(d.get("is_processing", False)),
            is_preempted=bool(d.get("is_preempted", False)),
            preempt_mode=d.get("preempt_mode"),
            n_tokens=int(n_tokens or 0),
            n_decoded=int(n_decoded or 0),
            n_preempt=int(d.get("n_preempt", 0)),
            n_recompute=int(d.get("n_recompute", 0)),
            preempt_ram_bytes=int(d.get("preempt_ram_bytes", 0)),
            t_preempted_ms=float(d.get("t_preempted_ms", 0.0)),
            id_cmpl=d.get("id_cmpl") or None,
            priority=int(d.get("priority", 0)),
            preempt_choice=d.get("preempt_choice") or None,
            preempt_copy_in_flight=bool(d.get("preempt_copy_in_flight", False)),
            preempt_tier=d.get("preempt_tier") or None,
            preempt_disk_bytes=int(d.get("preempt_disk_bytes", 0) or 0),
            is_paused=bool(d.get("is_paused", False)),
            n_cells_shared=int(d.get("n_cells_shared", 0) or 0),
        )

    @classmethod
    def from_core(cls, s: Any) -> "SlotStats":
        """From a slot of the Engine's stats (_core.SlotStatsCore): typed, its enums as they are
        (str enums equal to the names /slots writes)."""
        p = s.park
        parked = p.is_preempted
        return cls(
            id=s.id, state=p.state, is_processing=s.is_processing, is_preempted=parked,
            preempt_mode=(_core.PreemptMode.RECOMPUTE if p.tier == _core.ParkTier.RECOMPUTE else _core.PreemptMode.SWAP)
            if parked else None,
            n_tokens=s.n_tokens, n_decoded=s.n_decoded, n_preempt=p.n_preempt, n_recompute=p.n_recompute,
            preempt_ram_bytes=p.ram_bytes, t_preempted_ms=p.t_preempted_ms, id_cmpl=p.id_cmpl or None,
            priority=p.priority, preempt_choice=p.choice if parked else None, preempt_copy_in_flight=p.copy_in_flight,
            preempt_tier=p.tier if parked else None, preempt_disk_bytes=p.disk_bytes, is_paused=p.is_paused,
            n_cells_shared=p.n_cells_shared,
        )


@dataclass(frozen=True)
class PreemptStats:
    """The counters and gauges /metrics shows, and the slots."""

    n_preempt_total: int = 0
    n_preempt_swap_total: int = 0
    n_preempt_recompute_total: int = 0
    n_resume_total: int = 0
    n_recompute_tokens_total: int = 0
    n_swap_restore_fail_total: int = 0
    n_restore_ahead_total: int = 0        # SWAP restores whose bytes were uploaded to the device ahead
    n_swap_restore_ahead_total: int = 0   # deprecated: n_restore_ahead_total under its old name (removed in the next release)
    n_preempt_fail_total: int = 0
    n_queue_full_total: int = 0           # requests answered 503 at once: --max-queue requests waited for a slot
    n_preempt_bytes_moved_total: int = 0  # SWAP's wasted work: state bytes copied out and back
    requests_preempted: int = 0
    preempt_ram_bytes: int = 0
    preempt_ram_pool_bytes: int = 0       # idle host RAM kept for the next swap buffers
    preempt_copies_in_flight: int = 0     # SWAP parks whose copy to host RAM may still run
    preempt_park_bytes_per_second: int = 0      # the rates SWAP or RECOMPUTE is chosen with now
    preempt_restore_bytes_per_second: int = 0
    preempt_prefill_tokens_per_second: int = 0
    preempt_disk_write_bytes_per_second: int = 0  # the disk tier's measured rates (a disk park's price)
    preempt_disk_read_bytes_per_second: int = 0
    preempt_ram_q8_pack_bytes_per_second: int = 0    # the compressed tier's measured rates (its price)
    preempt_ram_q8_unpack_bytes_per_second: int = 0
    preempt_ram_q8_packed_percent: int = 0           # its packed bytes per 100 bytes of state
    preempt_disk_bytes: int = 0           # bytes in the disk tier's files now
    preempt_disk_writes_in_flight: int = 0  # disk parks whose file is still being written
    n_disk_write_bytes_total: int = 0
    n_disk_read_bytes_total: int = 0
    n_disk_write_us_total: int = 0        # the I/O thread's time for those bytes: their rate
    n_disk_read_us_total: int = 0
    n_disk_read_ahead_total: int = 0      # files read back ahead of their resume
    n_disk_restore_from_memory_total: int = 0  # disk parks resumed from their host copy (still held)
    preempt_disk_full_total: int = 0      # disk writes refused or cut short: the filesystem is full (not the budget)
    n_disk_dir_remade_total: int = 0      # the disk tier's directory made again after it was removed
    kv_pool_cells: int = 0                # cells in the pool (-c)
    kv_pool_cells_used: int = 0           # cells the slots hold now
    server_draining: int = 0              # 1 while the server drains on SIGTERM/SIGINT
    n_swap_verify_total: int = 0          # the copy guard (--preempt-verify): copies checked byte for byte
    n_swap_verify_mismatch_total: int = 0  #   of those, not byte-identical
    n_copy_route_changes_total: int = 0   # devices the guard moved to a safer route after a wrong copy
    preempt_host_budget_bytes: int = 0    # --host-kv-ram: parked slots and cached prompts together (0: no limit)
    prompt_cache_bytes: int = 0           # upstream's prompt cache in host RAM now
    n_prompt_cache_evicted_total: int = 0  # cached prompts that gave way to parked slots
    prompt_cache_disk_bytes: int = 0      # cached prompts in the disk tier's files now
    n_prompt_cache_spilled_total: int = 0  # cached prompts that left RAM for the disk tier
    n_prompt_cache_disk_hits_total: int = 0  # read back for a request whose prefix matched
    n_prompt_cache_read_ahead_total: int = 0  # files read ahead while their request waited for a slot
    n_prompt_cache_disk_failures_total: int = 0  # prompt files that failed to write or read back
    n_prompt_cache_load_failures_total: int = 0  # prompts read back from disk that upstream's load refused (prefilled)
    n_prompt_cache_disk_skipped_total: int = 0  # dropped, not written (no room, media)
    n_prompt_cache_streamed_total: int = 0  # larger than the RAM cache: streamed from the slot to the disk tier
    n_prompt_cache_streamed_back_total: int = 0  # prompt files streamed straight into a slot
    n_paused_total: int = 0               # times a generating slot was paused (beyond the decode width)
    n_prefix_links_total: int = 0         # prompts that linked the longest prefix another slot held (--prefix-share)
    n_prompt_tokens_linked_total: int = 0  #   the prompt tokens they linked instead of evaluating
    kv_pool_cells_saved: int = 0          # cells the slots hold beyond the pool's used ones: shared prefixes held once
    requests_paused: int = 0              # generating beyond the decode width now (they keep their cells)
    preempt_decode_width: int = 0         # generating slots the last step let decode
    preempt_step_fixed_ns: int = 0        # the step cost fitted from the server's own steps:
    preempt_step_decode_token_ns: int = 0  #   fixed, per generated token, per prompt token,
    preempt_step_prompt_token_ns: int = 0
    preempt_step_attend_kcell_ns: int = 0  #   per thousand cells attended
    preempt_step_cost_samples: int = 0    #   and the steps it was fitted from
    n_loop_steps_total: int = 0           # steps of the loop timed in loop_us
    n_width_probes_total: int = 0         # windows at full width the width rule ran to check itself
    n_width_fallbacks_total: int = 0      #   of those, after which the limited width had lost more than width-loss
    preempt_step_span_mcell_ns: int = 0   # the fitted step cost per million cells the attention spans
    http_connections_open: int = 0        # HTTP connections open now (an Engine has no listener: 0)
    n_http_refused_total: int = 0         # connections answered 503 at once: --max-connections were open
    n_http_read_timeouts_total: int = 0   # requests not in by --read-deadline: closed
    n_http_stalled_total: int = 0         # responses ended: the client read nothing for --stall-timeout
    n_http_idle_closed_total: int = 0     # connections closed after --keep-alive-timeout without a request
    slots: tuple[SlotStats, ...] = field(default_factory=tuple)
    parks_by_choice: Mapping[str, int] = field(default_factory=dict)  # preempt_parks_by_choice_total: label -> parks
    parks_by_tier: Mapping[str, int] = field(default_factory=dict)    # preempt_parks_by_tier_total: ram, disk, recompute
    restores_by_tier: Mapping[str, int] = field(default_factory=dict)  # preempt_restores_by_tier_total
    disk_failures: Mapping[str, int] = field(default_factory=dict)    # preempt_disk_failures_total: kind -> failures
    slot_file_failures: Mapping[str, int] = field(default_factory=dict)  # preempt_slot_file_failures_total: kind -> saves/restores refused
    loop_us: Mapping[str, int] = field(default_factory=dict)  # preempt_loop_us_total: plan, decode, post, other -> microseconds
    age_ms: float = 0.0  # how old they are: the Engine's are as of its last step boundary (never waiting for a step)

    # the rates by their shorter names
    @property
    def park_bytes_per_second(self) -> int:
        return self.preempt_park_bytes_per_second

    @property
    def restore_bytes_per_second(self) -> int:
        return self.preempt_restore_bytes_per_second

    @property
    def prefill_tokens_per_second(self) -> int:
        return self.preempt_prefill_tokens_per_second

    @classmethod
    def from_series(cls, values: Mapping[str, float], slots: list[Mapping[str, Any]],
                    labeled: Mapping[str, Mapping[str, float]] | None = None, age_ms: float = 0.0) -> "PreemptStats":
        """From the series by name (every one of SERIES), the slots and the labeled counters by
        series name (preempt_parks_by_choice_total: {"swap_cheaper": 3, ...}; those absent stay empty)."""
        missing = [n for n, _ in SERIES if n not in values]
        if missing:
            raise KeyError(f"preemption series missing: {', '.join(missing)} (is this llama-preempt's server?)")
        by_label = {labeled_field(name): {k: int(v) for k, v in (labeled or {}).get(name, {}).items()}
                    for name, _ in LABELED}
        return cls(**{n: int(values[n]) for n, _ in SERIES}, slots=tuple(SlotStats.from_json(s) for s in slots),
                   age_ms=float(age_ms), **by_label)

    @classmethod
    def from_core(cls, st: Any) -> "PreemptStats":
        """From the Engine's stats (_core.EngineStatsCore): every series, the labeled counters and
        the slots, as C++ typed them."""
        return cls(**{it.name: it.value for it in st.series}, slots=tuple(SlotStats.from_core(s) for s in st.slots),
                   age_ms=st.age_ms, **{labeled_field(lm.name): dict(lm.values) for lm in st.labeled})

    def parked(self) -> list[SlotStats]:
        return [s for s in self.slots if s.is_preempted]

    def paused(self) -> list[SlotStats]:
        return [s for s in self.slots if s.is_paused]
