"""Size a deployment before you run it: the server loop in simulation, with the server's own planner.

    from llama_preempt.simulator import Workload, simulate
    wl = Workload.synthetic(n_requests=200, rate=4.0, prompt="100-400", gen="200-600", seed=1)
    print(simulate(wl, n_ctx=8192, n_parallel=8, preempt_ram_mib=512))

The loop runs in `_core` (csrc/sim/preempt-sim.cpp) and calls `plan_step()`, the function the server
calls every step, so what it parks, resumes and holds is what the server would. Time comes from
per-token costs (`Costs`): the defaults were measured on SmolLM2-135M Q4_1 on 2 CPU cores;
`calibrate(url)` measures the decode and prefill costs of a running server.
"""
from __future__ import annotations

import json
import math
import random
import statistics
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import _core


class WorkloadError(ValueError):
    pass


@dataclass(frozen=True)
class Costs:
    """What the simulated server's steps and copies cost. A step costs `step_ms`, plus
    `decode_token_ms` per generated token and `prefill_token_ms` per prompt (or replayed) token in
    it, plus `attend_cell_ns` per cell its tokens attend (a token at position p reads p + 1 cells;
    the batch's total context, the term a step cost of tokens alone lacks), plus `span_cell_ns` per
    cell the attention spans (in a unified pool every token's attention covers the pool's used
    cells, the others' masked: a kernel that does not skip them pays for them). The defaults are the
    server's own fit (`preempt_step_*` in /metrics) for SmolLM2-135M-Instruct Q4_1 on this project's
    2-core machine; `calibrate()` reads a running server's."""

    step_ms: float = 5.0           # fixed cost of a step that decodes anything
    decode_token_ms: float = 8.5   # per generated token in a step
    prefill_token_ms: float = 4.8  # per prompt (or replayed) token
    attend_cell_ns: float = 4500.0  # per cell attended, summed over the step's tokens
    span_cell_ns: float = 0.0      # per cell the attention spans, summed over the step's tokens (a unified pool:
                                   # every token spans the pool's used cells; a static split: its own cells)
    bytes_per_cell: float = 23040  # KV bytes per cell (SmolLM2-135M: 30 layers x 2 x 3 x 64 x f16)
    state_overhead_bytes: float = 0  # bytes of a parked state beyond its cells (the serializer's headers)
    swap_out_gbps: float = 9.5     # park copy, GB/s (the bulk copy on this machine, bench/swap_bandwidth.py)
    swap_in_gbps: float = 15.0     # restore copy, GB/s
    disk_write_gbps: float = _core.DEFAULT_DISK_WRITE_BPS / 1e9  # the disk tier's file writes, GB/s (the server's default price)
    disk_read_gbps: float = _core.DEFAULT_DISK_READ_BPS / 1e9    # and reads
    pack_gbps: float = _core.DEFAULT_PACK_BPS / 1e9       # the compressed tier's packing to q8_0, GB/s of state
    unpack_gbps: float = _core.DEFAULT_UNPACK_BPS / 1e9   # and unpacking
    pack_ratio: float = _core.DEFAULT_PACK_RATIO          # packed bytes per byte of state

    def step_cost(self) -> Any:
        """The step's part as the policy's `_core.StepCost` (seconds)."""
        return _core.StepCost(fixed_s=self.step_ms / 1000, decode_token_s=self.decode_token_ms / 1000,
                              prompt_token_s=self.prefill_token_ms / 1000, attend_cell_s=self.attend_cell_ns / 1e9,
                              span_cell_s=self.span_cell_ns / 1e9)

    def to_params(self, p: Any) -> None:
        p.cost = self.step_cost()
        p.bytes_per_cell = self.bytes_per_cell
        p.state_overhead_bytes = self.state_overhead_bytes
        p.swap_out_bps = self.swap_out_gbps * 1e9
        p.swap_in_bps = self.swap_in_gbps * 1e9
        p.disk_write_bps = self.disk_write_gbps * 1e9
        p.disk_read_bps = self.disk_read_gbps * 1e9
        p.pack_bps = self.pack_gbps * 1e9
        p.unpack_bps = self.unpack_gbps * 1e9
        p.pack_ratio = self.pack_ratio


def _parse_len(spec: str | int, what: str) -> tuple[int, int]:
    """'200' (fixed) or '100-400' (uniform) -> (lo, hi)."""
    text = str(spec).strip()
    try:
        if "-" in text:
            lo_s, hi_s = text.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
        else:
            lo = hi = int(text)
    except ValueError:
        raise WorkloadError(f"{what}: expected N or LO-HI (tokens), got {spec!r}") from None
    if lo < 1 or hi < lo:
        raise WorkloadError(f"{what}: expected 1 <= LO <= HI, got {spec!r}")
    return lo, hi


@dataclass(frozen=True)
class Workload:
    """Requests by arrival time (seconds), prompt tokens and tokens to generate. A multi-turn chat
    also says, per request, the conversation it continues (-1: none; its prompt starts with that
    conversation's earlier prompt and answer), the leading prompt tokens every request shares (a
    common system prompt), and the request it follows (-1: none; an earlier index): it arrives
    `t_arrival` seconds after that one's answer, as a user's next turn does. Empty: no chats."""

    t_arrival: tuple[float, ...]
    n_prompt: tuple[int, ...]
    n_gen: tuple[int, ...]
    conversation: tuple[int, ...] = ()
    n_shared: tuple[int, ...] = ()
    after: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.t_arrival)
        if len(self.n_prompt) != n or len(self.n_gen) != n:
            raise WorkloadError("a workload needs as many prompt and answer lengths as arrival times")
        for name in ("conversation", "n_shared", "after"):
            col = getattr(self, name)
            if col and len(col) != n:
                raise WorkloadError(f"a workload's {name} must be empty or one per request")
        if any(a >= i for i, a in enumerate(self.after)):
            raise WorkloadError("a request can only follow an earlier one (after: an earlier index, or -1)")

    def __len__(self) -> int:
        return len(self.t_arrival)

    @property
    def has_chats(self) -> bool:
        """Prompts that share prefixes (conversations or a common system prompt): a prompt cache helps."""
        return any(c >= 0 for c in self.conversation) or any(self.n_shared)

    @classmethod
    def chat(cls, users: int, turns: int, *, system: int = 300, first: int = 300, turn: int = 20, gen: int = 24,
             think_s: float = 0.0, rate: float = 0.0, one_client: bool = False, seed: int = 0) -> "Workload":
        """`users` conversations of `turns` turns. Each prompt is the whole conversation: a `system`
        prompt every user shares, the user's own `first` tokens in its first turn, then per turn its
        `turn` new tokens after the answers so far (`gen` tokens each). A user's next turn comes
        `think_s` seconds after its answer; users start at `rate` a second (0: all at once).
        `one_client`: one client asks for every user in turn, each request after the answer before
        it (user 1 turn 1, user 2 turn 1, ..., user 1 turn 2, ...), as bench/prompt_cache.py does."""
        if users < 1 or turns < 1 or system < 0 or first < 0 or turn < 1 or gen < 1 or think_s < 0 or rate < 0:
            raise WorkloadError("chat: needs users >= 1, turns >= 1, turn and gen >= 1, system, first, think and rate >= 0")
        rng = random.Random(seed)
        start, t = [], 0.0
        for _ in range(users):
            start.append(t)
            if rate > 0:
                t += rng.expovariate(rate)
        ts: list[float] = []
        ps: list[int] = []
        cv: list[int] = []
        af: list[int] = []
        length = [system + first] * users
        last = [-1] * users
        for k in range(turns):
            for u in range(users):
                length[u] += turn
                if one_client:
                    af.append(len(ts) - 1)
                    ts.append(think_s if ts else 0.0)
                else:
                    af.append(last[u])
                    ts.append(start[u] if k == 0 else think_s)
                last[u] = len(ps)
                ps.append(length[u])
                cv.append(u)
                length[u] += gen
        n = len(ps)
        return cls(tuple(ts), tuple(ps), (gen,) * n, tuple(cv), (system,) * n, tuple(af))

    @classmethod
    def synthetic(cls, n_requests: int, *, rate: float = 0.0, prompt: str | int = "100-400",
                  gen: str | int = "100-400", seed: int = 0) -> "Workload":
        """Poisson arrivals at `rate` requests/s (0: all at once); lengths fixed ('N') or uniform ('LO-HI')."""
        if n_requests < 1:
            raise WorkloadError("--requests must be at least 1")
        if rate < 0:
            raise WorkloadError("--rate must be >= 0 (0: all requests arrive at once)")
        p_lo, p_hi = _parse_len(prompt, "--prompt-len")
        g_lo, g_hi = _parse_len(gen, "--gen-len")
        rng = random.Random(seed)
        t = 0.0
        ts, ps, gs = [], [], []
        for _ in range(n_requests):
            if rate > 0:
                t += rng.expovariate(rate)
            ts.append(t)
            ps.append(rng.randint(p_lo, p_hi))
            gs.append(rng.randint(g_lo, g_hi))
        return cls(tuple(ts), tuple(ps), tuple(gs))

    @classmethod
    def lognormal(cls, n_requests: int, *, rate: float, prompt_median: int, gen_median: int, sigma: float = 1.0,
                  max_prompt: int = 4096, max_gen: int = 4096, seed: int = 0) -> "Workload":
        """Chat and agent traffic: Poisson arrivals at `rate` requests/s, prompt and answer lengths
        log-normal around their medians (sigma 1: most are short, a few are many times longer),
        capped at max_prompt / max_gen."""
        if n_requests < 1 or rate <= 0 or prompt_median < 1 or gen_median < 1 or sigma < 0:
            raise WorkloadError("lognormal: needs n_requests >= 1, rate > 0, medians >= 1 and sigma >= 0")
        rng = random.Random(seed)
        t = 0.0
        ts, ps, gs = [], [], []
        for _ in range(n_requests):
            t += rng.expovariate(rate)
            ts.append(t)
            ps.append(max(1, min(max_prompt, round(rng.lognormvariate(math.log(prompt_median), sigma)))))
            gs.append(max(1, min(max_gen, round(rng.lognormvariate(math.log(gen_median), sigma)))))
        return cls(tuple(ts), tuple(ps), tuple(gs))

    def to_jsonl(self, path: Path) -> None:
        """The workload in from_jsonl()'s format (`llama-preempt simulate --workload FILE` reads it)."""
        lines = []
        for i, (t, p, g) in enumerate(zip(self.t_arrival, self.n_prompt, self.n_gen)):
            d: dict[str, Any] = {"t": round(t, 4), "prompt_tokens": p, "max_tokens": g}
            for key, col in (("conversation", self.conversation), ("shared_tokens", self.n_shared), ("after", self.after)):
                if col:
                    d[key] = col[i]
            lines.append(json.dumps(d) + "\n")
        Path(path).write_text("".join(lines))

    @classmethod
    def from_jsonl(cls, path: Path) -> "Workload":
        """One request a line: {"t": seconds (default 0), "prompt_tokens": N, "max_tokens": M}
        (also accepted: "arrival", "n_prompt", "n_predict", "n_gen"); a chat's requests may add
        "conversation", "shared_tokens" and "after" (a 0-based line index among the requests, and
        then "t" is the pause after that request's answer)."""
        ts, ps, gs = [], [], []
        cv: list[int] = []
        sh: list[int] = []
        af: list[int] = []
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as e:
            raise WorkloadError(f"--workload: cannot read {path}: {e.strerror}") from None
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                t = float(d.get("t", d.get("arrival", 0.0)))
                p = int(d.get("prompt_tokens", d.get("n_prompt")))
                g = int(d.get("max_tokens", d.get("n_predict", d.get("n_gen"))))
                c, n_sh, a = int(d.get("conversation", -1)), int(d.get("shared_tokens", 0)), int(d.get("after", -1))
            except (ValueError, TypeError, AttributeError):
                raise WorkloadError(f"--workload {path}:{i}: expected a JSON object with prompt_tokens and "
                                    f"max_tokens (and optionally t), got {line[:80]!r}") from None
            if p < 1 or g < 1 or t < 0:
                raise WorkloadError(f"--workload {path}:{i}: tokens must be >= 1 and t >= 0")
            if n_sh < 0 or not -1 <= a < len(ts):
                raise WorkloadError(f"--workload {path}:{i}: shared_tokens must be >= 0 and after an earlier request "
                                    f"(0 to {len(ts) - 1}) or -1")
            ts.append(t)
            ps.append(p)
            gs.append(g)
            cv.append(c)
            sh.append(n_sh)
            af.append(a)
        if not ts:
            raise WorkloadError(f"--workload {path}: no requests in the file")
        chats = any(c >= 0 for c in cv) or any(sh) or any(a >= 0 for a in af)
        return cls(tuple(ts), tuple(ps), tuple(gs), *((tuple(cv), tuple(sh), tuple(af)) if chats else ()))


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


@dataclass(frozen=True)
class SimReport:
    n_ctx: int
    n_parallel: int
    preempt: bool
    preempt_ram_mib: int
    preempt_mode: str
    requests: int
    completed: int
    failed: int
    parks_swap: int
    parks_recompute: int
    resumes: int
    recomputed_tokens: int
    tokens_generated: int
    peak_parked_mib: float
    peak_cells: int
    ttft_p50_s: float
    ttft_p99_s: float
    queue_p50_s: float
    queue_p99_s: float
    longest_park_s: float
    makespan_s: float
    steps: int
    hit_step_limit: bool = False
    preempt_disk_mib: int = 0      # the disk tier (0: none, -1: no limit)
    parks_disk: int = 0            # of parks_swap, those to the disk tier
    parks_ram_q8: int = 0          # of parks_swap, those packed to q8_0 (preempt_compress="q8_0")
    peak_disk_mib: float = 0.0
    parks_by_choice: dict[str, int] = field(default_factory=dict)  # as /metrics' preempt_parks_by_choice_total
    e2e_p50_s: float = float("nan")   # arrival to last token, of the completed requests
    e2e_p99_s: float = float("nan")
    ttst_p50_s: float = float("nan")  # arrival to second token (the first one decoded after the prompt)
    ttst_p99_s: float = float("nan")
    gap_max_s: float = float("nan")   # the longest wait between two tokens of any request
    tok_s: float = float("nan")       # tokens generated over the makespan
    decode_width_mean: float = 0.0    # the decode width the planner chose, over the steps where a slot generated
    decode_width_max: int = 0
    cache_ram_mib: int = 0            # the RAM prompt cache (0: none)
    prompt_tokens_computed: int = 0   # prompt tokens prefilled (what the prompt cache did not save)
    prompt_tokens_cached: int = 0     # prompt tokens reused (the slot's cells, the RAM cache, a file read back)
    prompt_cache_ram_hits: int = 0
    prompt_cache_disk_hits: int = 0   # prompt files read back
    prompt_cache_spilled: int = 0     # cached prompts written to the disk tier
    prompt_cache_disk_skipped: int = 0  # cached prompts dropped: no room on disk even with older files gone
    prompt_cache_streamed: int = 0    # of the spilled, prompts larger than the RAM cache streamed from their slot
    prompt_cache_streamed_back: int = 0  # of the disk hits, files streamed straight into a slot
    peak_cache_mib: float = 0.0
    per_request: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def parks(self) -> int:
        return self.parks_swap + self.parks_recompute

    def to_json(self, per_request: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not per_request:
            d.pop("per_request")
        return d


def simulate(workload: Workload, *, n_ctx: int, n_parallel: int, n_batch: int = 512, preempt: bool = True,
             preempt_ram_mib: int = 8192, preempt_mode: str = "auto", preempt_disk_mib: int = 0,
             costs: Costs = Costs(), max_steps: int = 50_000_000, sched: Any = None, host_kv_ram_mib: int = -2,
             cache_ram_mib: int | None = None, kv_unified: bool = True, attn_own_cells: bool = True,
             preempt_compress: str = "none") -> SimReport:
    """Run the workload through the simulated server; see the module docstring. `preempt_disk_mib`:
    a disk tier of that many MiB (-1: no limit; 0: none), priced with `costs`' disk rates. `sched`:
    the planner's scheduling knobs: llama-server's --preempt-sched text ("width-loss=0,...") or a
    `_core.SchedParams` (None: the server's defaults).
    `host_kv_ram_mib`: the server's --host-kv-ram (-2: not given), which parks and the prompt cache share.
    `cache_ram_mib`: upstream's RAM prompt cache (--cache-ram; -1 no limit, 0 none; None: the
    server's 8192 for a workload with chats, none otherwise, where no prompt shares a prefix).
    `kv_unified`: False for a static split (--no-kv-unified: `n_ctx` the slots' shares together,
    each slot's attention spanning its own cells; with `preempt=False`).
    `attn_own_cells`: a unified pool's attention walks each slot's own cells, as the server's flash
    attention on the CPU does (--attn-own-cells, the default); False where it spans the pool's used
    cells (-fa off, --no-attn-own-cells, a device whose kernel ignores the runs: CUDA's today).
    `preempt_compress`: "q8_0" offers the compressed tier (--preempt-compress q8_0: host RAM packed to
    q8_0, priced with `costs`' pack and unpack rates and packed share)."""
    try:  # llama-server's own check and words
        compress_q8 = _core.parse_preempt_compress(preempt_compress)
    except ValueError as e:
        raise WorkloadError(str(e)) from None
    p = sim_params(n_ctx=n_ctx, n_parallel=n_parallel, n_batch=n_batch, preempt=preempt,
                   preempt_ram_mib=preempt_ram_mib, preempt_mode=preempt_mode, preempt_disk_mib=preempt_disk_mib,
                   costs=costs, max_steps=max_steps, sched=sched, host_kv_ram_mib=host_kv_ram_mib,
                   cache_ram_mib=default_cache_ram(workload, cache_ram_mib))
    p.kv_unified = kv_unified
    p.attn_own_cells = attn_own_cells
    p.compress_q8 = compress_q8
    r = _core.simulate(list(workload.t_arrival), list(workload.n_prompt), list(workload.n_gen), p,
                       list(workload.conversation), list(workload.n_shared), list(workload.after))
    return sim_report(r, workload.t_arrival, n_ctx=n_ctx, n_parallel=n_parallel, preempt=preempt,
                      preempt_ram_mib=preempt_ram_mib, preempt_mode=preempt_mode, preempt_disk_mib=preempt_disk_mib,
                      cache_ram_mib=p.cache_ram_mib)


def default_cache_ram(workload: Workload, cache_ram_mib: int | None) -> int:
    """--cache-ram for a simulation: as given, else the server's default (8192 MiB) where prompts share prefixes."""
    if cache_ram_mib is None:
        return 8192 if workload.has_chats else 0
    return cache_ram_mib


def sched_params(sched: Any) -> Any:
    """The planner's knobs: llama-server's --preempt-sched text, read as the server reads it, or a
    `_core.SchedParams` as it is; None: the defaults."""
    if sched is None:
        return _core.SchedParams()
    if isinstance(sched, str):
        try:
            return _core.parse_preempt_sched(sched)
        except ValueError as e:
            raise WorkloadError(str(e).replace("--preempt-sched", "--sched")) from None
    return sched


def sim_params(*, n_ctx: int, n_parallel: int, n_batch: int, preempt: bool, preempt_ram_mib: int,
               preempt_mode: str, costs: Costs, max_steps: int, preempt_disk_mib: int = 0, sched: Any = None,
               host_kv_ram_mib: int = -2, cache_ram_mib: int = 0) -> Any:
    """The checked `_core.SimParams` of one simulated server (simulate() and the fleet's)."""
    if n_ctx < 2:
        raise WorkloadError("--ctx must be at least 2 cells")
    if n_parallel < 1:
        raise WorkloadError("--parallel must be at least 1")
    if n_batch < 1:
        raise WorkloadError("--batch must be at least 1")
    try:  # llama-server's own checks and words
        _core.parse_preempt_ram_mib(str(preempt_ram_mib))
        _core.parse_preempt_mode(preempt_mode)
        if preempt_disk_mib != 0:
            _core.parse_preempt_disk_mib(str(preempt_disk_mib))
        if host_kv_ram_mib != -2:
            _core.parse_host_kv_ram_mib(str(host_kv_ram_mib))
    except ValueError as e:
        raise WorkloadError(str(e)) from None
    if cache_ram_mib < -1:
        raise WorkloadError(f"--cache-ram must be -1 (no limit), 0 (no prompt cache) or a size in MiB, got {cache_ram_mib}")
    p = _core.SimParams()
    p.mode = preempt_mode
    p.n_pool, p.n_slots, p.n_batch, p.preempt = n_ctx, n_parallel, n_batch, preempt
    p.preempt_ram_mib, p.preempt_disk_mib = preempt_ram_mib, preempt_disk_mib  # the policy converts them
    p.max_steps = max_steps
    p.host_kv_ram_mib, p.cache_ram_mib = host_kv_ram_mib, cache_ram_mib
    p.sched = sched_params(sched)
    costs.to_params(p)
    return p


def latencies(per_request: Iterable[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """(TTFT, queueing) in seconds of the completed requests."""
    done = [q for q in per_request if q["outcome"] == "completed"]
    return [q["t_first"] - q["t_arrival"] for q in done], [q["t_start"] - q["t_arrival"] for q in done]


def sim_report(r: Any, arrivals: Sequence[float], *, n_ctx: int, n_parallel: int, preempt: bool,
               preempt_ram_mib: int, preempt_mode: str, preempt_disk_mib: int = 0, cache_ram_mib: int = 0) -> SimReport:
    """The report of one simulated server: its `_core.SimResult` and its requests' arrival times
    (a turn that follows another arrives when the simulation says, its own arrival then)."""
    reqs = r.requests
    per = [{"outcome": str(q.outcome), "t_arrival": q.t_arrival if q.t_arrival >= 0 else arrival, "t_start": q.t_start,
            "t_first": q.t_first, "t_second": q.t_second, "t_done": q.t_done, "n_preempt": q.n_preempt,
            "t_parked_s": q.t_parked_s, "max_gap_s": q.max_gap_s, "n_prompt_cached": q.n_prompt_cached,
            "cached_from": q.cached_from}
           for arrival, q in zip(arrivals, reqs)]
    ttft, queue = latencies(per)
    done = [q for q in per if q["outcome"] == "completed"]
    e2e = [q["t_done"] - q["t_arrival"] for q in done]
    ttst = [q["t_second"] - q["t_arrival"] for q in done if q["t_second"] >= 0]
    return SimReport(
        n_ctx=n_ctx, n_parallel=n_parallel, preempt=preempt, preempt_ram_mib=preempt_ram_mib, preempt_mode=preempt_mode,
        requests=len(reqs), completed=sum(1 for q in reqs if q.outcome == _core.SimOutcome.COMPLETED),
        failed=sum(1 for q in reqs if q.outcome == _core.SimOutcome.FAILED),
        parks_swap=r.n_park_swap, parks_recompute=r.n_park_recompute, resumes=r.n_resume,
        recomputed_tokens=r.n_recompute_tokens, tokens_generated=r.n_tokens_generated,
        peak_parked_mib=r.peak_parked_bytes / 2**20, peak_cells=r.peak_cells,
        ttft_p50_s=_pct(ttft, 50), ttft_p99_s=_pct(ttft, 99), queue_p50_s=_pct(queue, 50), queue_p99_s=_pct(queue, 99),
        longest_park_s=max((q.t_parked_s for q in reqs), default=0.0),
        makespan_s=r.makespan_s, steps=r.n_steps, hit_step_limit=r.hit_step_limit,
        preempt_disk_mib=preempt_disk_mib, parks_disk=r.n_park_disk, parks_ram_q8=r.n_park_ram_q8, peak_disk_mib=r.peak_disk_bytes / 2**20,
        parks_by_choice={k: v for k, v in r.parks_by_choice.items() if v},
        e2e_p50_s=_pct(e2e, 50), e2e_p99_s=_pct(e2e, 99), ttst_p50_s=_pct(ttst, 50), ttst_p99_s=_pct(ttst, 99),
        gap_max_s=max((q["max_gap_s"] for q in done), default=float("nan")),
        tok_s=r.n_tokens_generated / r.makespan_s if r.makespan_s > 0 else float("nan"),
        decode_width_mean=r.mean_decode_width, decode_width_max=r.max_decode_width, cache_ram_mib=cache_ram_mib,
        prompt_tokens_computed=r.n_prompt_tokens_computed, prompt_tokens_cached=sum(q.n_prompt_cached for q in reqs),
        prompt_cache_ram_hits=r.n_prompt_cache_ram_hits, prompt_cache_disk_hits=r.n_prompt_cache_disk_hits,
        prompt_cache_spilled=r.n_prompt_cache_spilled, prompt_cache_disk_skipped=r.n_prompt_cache_disk_skipped,
        prompt_cache_streamed=r.n_prompt_cache_streamed, prompt_cache_streamed_back=r.n_prompt_cache_streamed_back,
        peak_cache_mib=r.peak_cache_bytes / 2**20, per_request=per)


def sweep(workload: Workload, *, ctxs: Iterable[int], budgets: Iterable[int], **kw: Any) -> list[SimReport]:
    """simulate() across pool sizes and host-RAM budgets (MiB), for picking -c and --preempt-ram."""
    return [simulate(workload, n_ctx=c, preempt_ram_mib=b, **kw) for c in ctxs for b in budgets]


# --- calibration against a running server ---

class CalibrationError(RuntimeError):
    pass


def server_pool(url: str, timeout: float = 10.0) -> tuple[int | None, int | None]:
    """The pool (cells, -c) and the slots (-np) of the llama-server at `url`, where it says them:
    the cells from llama-preempt's /metrics (kv_pool_cells), else a slot's context in /props; None
    where neither says."""
    import requests

    from .metrics import MetricsFormatError, parse_prometheus
    from .probe import NothingAnswers, NotLlamaServer, ServerURLError, llama_server_props, server_url

    try:
        url = server_url(url, "--calibrate")
        s = requests.Session()
        props = llama_server_props(s, url, timeout)
        cells: int | None = None
        m = s.get(url + "/metrics", timeout=timeout)
        if m.status_code == 200:
            try:
                cells = int(parse_prometheus(m.text)["kv_pool_cells"]) or None
            except (MetricsFormatError, KeyError, ValueError):
                cells = None
    except ServerURLError as e:
        raise CalibrationError(str(e)) from None
    except (NothingAnswers, NotLlamaServer, requests.RequestException) as e:
        raise CalibrationError(f"--calibrate: {e}") from None
    if cells is None:
        settings = props.get("default_generation_settings") or {}
        cells = int(settings.get("n_ctx", 0)) or None
    slots = int(props.get("total_slots", 0)) or None
    return cells, slots


def calibrate(url: str, base: Costs = Costs(), timeout: float = 120.0) -> Costs:
    """Measure the step costs of the server at `url`: a short load at temperature 0 with fixed
    lengths (one request alone, then several at once), then llama-preempt's own fit of its steps,
    which /metrics carries (preempt_step_*: fixed, per generated and prompt token, per cell
    attended; fitted from every step the server ran, this load's and what it served before). A
    stock server, which has no such series, is timed from its answers instead (one request alone,
    then several: no attention term). The KV bytes per cell and the copy bandwidths cannot be seen
    over HTTP and stay as in `base`."""
    import requests

    from .metrics import MetricsFormatError, parse_prometheus
    from .probe import NothingAnswers, NotLlamaServer, ServerURLError, llama_server_props, server_url

    try:
        url = server_url(url, "--calibrate")
        props = llama_server_props(requests.Session(), url, timeout=10)
    except ServerURLError as e:
        raise CalibrationError(str(e)) from None
    except (NothingAnswers, NotLlamaServer) as e:
        raise CalibrationError(f"--calibrate: {e}") from None
    n_par = max(1, min(4, int(props.get("total_slots", 1))))
    words = ("once upon a time there was a little girl who loved to play in the park with her red ball "
             "and her dog ").split()
    prompt = " ".join(words[i % len(words)] for i in range(200))

    def one(p: str, n: int) -> dict[str, Any]:
        r = requests.post(url + "/completion", json={"prompt": p, "n_predict": n, "temperature": 0,
                                                     "ignore_eos": True, "cache_prompt": False}, timeout=timeout)
        if r.status_code != 200:
            raise CalibrationError(f"--calibrate {url}: the server answered {r.status_code}: {r.text[:200]}")
        return dict(r.json()["timings"])

    one(" ".join(prompt.split()[:20]), 32)  # prompts of a few sizes alone, so the fit sees steps of each
    one(" ".join(prompt.split()[:80]), 32)
    solo = one(prompt, 64)
    out: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda i=i: out.append(one(f"{i} {' '.join(prompt.split()[:40 + 40 * i])}", 96)))
               for i in range(n_par)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # llama-preempt's server: its own fit of its steps, once it has enough of them
    try:
        m = requests.get(url + "/metrics", timeout=10)
        fit = parse_prometheus(m.text) if m.status_code == 200 else None
    except (requests.RequestException, MetricsFormatError):
        fit = None
    if fit is not None and fit.get("preempt_step_cost_samples", 0) >= _core.STEP_COST_N_READY:
        return replace(base, step_ms=fit["preempt_step_fixed_ns"] / 1e6,
                       decode_token_ms=fit["preempt_step_decode_token_ns"] / 1e6,
                       prefill_token_ms=fit["preempt_step_prompt_token_ns"] / 1e6,
                       attend_cell_ns=fit["preempt_step_attend_kcell_ns"] / 1e3,
                       span_cell_ns=fit.get("preempt_step_span_mcell_ns", 0.0) / 1e6)

    # a stock server: one token a step alone, n_par a step together
    prefill_ms = solo["prompt_ms"] / max(1, solo["prompt_n"])
    t1 = solo["predicted_ms"] / max(1, solo["predicted_n"])
    if n_par == 1:
        return replace(base, prefill_token_ms=prefill_ms, step_ms=t1 * 0.7, decode_token_ms=t1 * 0.3, attend_cell_ns=0.0)
    tn = statistics.median(o["predicted_ms"] / max(1, o["predicted_n"]) for o in out)
    decode_ms = max(0.0, (tn - t1) / (n_par - 1))
    return replace(base, prefill_token_ms=prefill_ms, decode_token_ms=decode_ms, step_ms=max(0.0, t1 - decode_ms),
                   attend_cell_ns=0.0)
