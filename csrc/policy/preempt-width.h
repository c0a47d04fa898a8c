// How many slots decode at once: a step's cost, fitted online from the server's own steps, and
// the width rule that reads it (docs/design.md, "Decode width").
//
// Every slot that decodes beside others stretches their answers; it pays only where the wider
// batch delivers more tokens a second. On a few CPU cores a wider batch buys little, so every slot
// beyond the few that pay for themselves only shares the processor and the longest answers are
// stretched; on a GPU a wider batch is nearly free. One rule serves both: the oldest slots decode,
// the fewest that deliver within `width_loss` of the throughput the best width would. The slots
// beyond that width keep their cells and wait (paused), oldest first back in. Pure C++ like the
// planner, so the server, the Engine and the simulator run it alike.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace llama_preempt {

// the shape of one step's batch, as its cost depends on it
struct step_shape {
    int32_t n_decode   = 0;  // generated tokens (one per decoding slot, plus drafts)
    int32_t n_prompt   = 0;  // prompt and replay tokens
    int64_t n_attended = 0;  // cells the batch's tokens attend, summed over its tokens (a token at
                             // position p of its sequence reads p + 1 cells)
    int64_t n_spanned  = 0;  // cells the attention spans for the batch's tokens, summed over them: in
                             // a unified pool every token's attention covers the pool's used cells
                             // (the others' masked), in a split pool its own stream's
};

// the cells one token's attention spans: the pool's used cells in a unified pool, its own sequence's
// (position + 1) in a split one
inline int64_t spanned_cells(bool unified, int64_t n_pool_used, int64_t pos) {
    return unified ? std::max<int64_t>(n_pool_used, pos + 1) : pos + 1;
}

// What one step of the loop costs, in seconds: the fixed part (weights read once, graph, the
// loop's own work), a part per generated and per prompt token (matrix rows, sampling), a part per
// cell attended (Vidur's and DistServe's term for the batch's total context, which a step cost of
// tokens alone lacks), and a part per cell spanned: in a unified pool a kernel that does not skip
// masked cells (CUDA's flash attention for a decode batch, the CPU's tiled one) reads the whole
// used pool for every token, so a step's cost grows with its tokens times the pool's occupancy.
struct step_cost {
    // defaults: SmolLM2-135M Q4_1 on this project's 2-core machine, as the server fits it under the
    // chat load of bench/mixed.py (bench/README.md, "Overload"); the server's fit starts from them
    double fixed_s        = 0.0050;
    double decode_token_s = 0.0085;
    double prompt_token_s = 0.0048;
    double attend_cell_s  = 4.5e-6;
    double span_cell_s    = 0.0;  // the prior: none (the CPU's vector path skips masked cells); the fit finds it

    double seconds(const step_shape & s) const {
        return fixed_s + decode_token_s * s.n_decode + prompt_token_s * s.n_prompt + attend_cell_s * (double) s.n_attended +
               span_cell_s * (double) s.n_spanned;
    }
};

// The step cost, fitted online: least squares over the server's (or the simulator's) own steps,
// the older ones weighing less (a half-life of about 350 steps, so a change of load or of the
// machine shows within seconds), held near `prior` only in the directions the steps have not
// explored (a weak ridge toward the prior: a server that has only ever decoded one slot at a time
// still has a split of fixed and per-token cost). No part is ever negative.
class step_cost_fit {
public:
    static constexpr int     N_PARAMS     = 5;
    static constexpr double  FORGET       = 1.0 - 1.0 / 512;  // weight kept by a step per newer step
    static constexpr double  PRIOR_WEIGHT = 0.1;              // the ridge: as a tenth of a step per part
    static constexpr int64_t N_READY      = 32;               // steps before the fit is trusted

    explicit step_cost_fit(const step_cost & prior = {});

    // one step measured: its shape and how long it took. A step far slower than the fit predicts
    // once it is trusted (a stall, a page fault, the machine busy elsewhere) is left out.
    void observe(const step_shape & s, double t_s);

    step_cost cost() const { return fitted; }
    int64_t   n_samples() const { return n; }
    bool      ready() const { return n >= N_READY; }  // before that, the width is not limited

private:
    step_cost prior;
    step_cost fitted;
    double    xtx[N_PARAMS][N_PARAMS] = {};  // the steps' sums, decayed
    double    xty[N_PARAMS]           = {};
    int64_t   n = 0;

    void solve();
};

// The width rule checks itself live. It chooses a width from the fitted step cost, and a fit can be
// wrong where the cost has a part it does not model (host work that grows with the slots, a device
// whose time the loop does not see). So now and then, while the width is limited, every slot
// decodes for a short window, and the decoded tokens per second of the loop's time in that window
// are set against the limited window just before it. Where the limited width delivers less than
// (1 - loss) of what every slot decoding does, the width is not limited for a long while, then
// tried again; where it holds, the next window comes twice as late (up to 16 times), so a width
// that keeps proving right costs few full-width steps. Pure C++, like the fit: the server, the
// Engine and the simulator keep one each.
class width_guard {
public:
    static constexpr int64_t PROBE_EVERY = 384;   // limited steps before the first window at full width
    static constexpr int64_t PROBE_MAX   = 16 * PROBE_EVERY;  // the longest interval, after windows that held
    static constexpr int64_t WINDOW      = 32;    // steps in a window (the limited one before and the full one)
    static constexpr int64_t HOLD        = 4096;  // steps at full width after the limited width lost

    // this step: may the width be limited? (false while probing at full width, or after a loss)
    bool allow_limit() const { return phase != phase_t::probe && hold_left == 0; }

    // one step measured: its decoded tokens, the loop's time it took (s), and whether its width was
    // limited (some generating slot sat out); `loss` the width-loss it is held to
    void observe(int32_t n_decode, double t_s, bool limited, double loss);

    int64_t n_probes() const { return probes; }      // windows at full width run
    int64_t n_fallbacks() const { return fallbacks; } // of those, windows after which the limit was held off
    double  last_limited_tps() const { return limited_tps; }  // the last comparison's throughputs (tokens/s)
    double  last_full_tps() const { return full_tps; }

private:
    enum class phase_t { limited, probe };
    phase_t phase = phase_t::limited;
    int64_t since_probe = 0;              // limited steps since the last window
    int64_t probe_every = PROBE_EVERY;    // limited steps between windows now
    double  win_tokens = 0, win_s = 0;    // the limited window just before a probe (rolling)
    int64_t win_steps = 0;
    double  lim_tokens = 0, lim_s = 0;    // the limited window the probe is compared with
    double  probe_tokens = 0, probe_s = 0;
    int64_t probe_steps = 0;
    int64_t hold_left = 0;
    int64_t probes = 0, fallbacks = 0;
    double  limited_tps = 0, full_tps = 0;
};

// Of the generating slots, oldest first (`u` each one's marginal cost: a generated token plus the
// cells it attends), how many decode this step: the fewest k whose throughput
// thr(k) = k / (fixed + u_1 + ... + u_k) is within `loss` of the best width's. With equal u,
// thr(k) = k / (fixed + k u) rises towards 1 / u, steeply where the fixed part dominates (a GPU:
// a wide k) and hardly at all where the per-token part does (a few CPU cores: a narrow k).
// loss <= 0: every slot (no width control); at least 1 when any slot generates.
int32_t decode_width(double fixed_s, const std::vector<double> & u, double loss);

// the marginal cost of one more decoding slot whose sequence holds `n_cells` and whose step
// carries `n_tokens` (one, or one plus its draft); `n_span` the cells each of its tokens' attention
// spans (spanned_cells(): the pool's used cells in a unified pool; 0: its own)
double decode_slot_cost(const step_cost & c, int32_t n_cells, int32_t n_tokens, int64_t n_span = 0);

} // namespace llama_preempt
