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

#include <cstdint>
#include <vector>

namespace llama_preempt {

// the shape of one step's batch, as its cost depends on it
struct step_shape {
    int32_t n_decode   = 0;  // generated tokens (one per decoding slot, plus drafts)
    int32_t n_prompt   = 0;  // prompt and replay tokens
    int64_t n_attended = 0;  // cells the batch's tokens attend, summed over its tokens (a token at
                             // position p of its sequence reads p + 1 cells)
};

// What one step of the loop costs, in seconds: the fixed part (weights read once, graph, the
// loop's own work), a part per generated and per prompt token (matrix rows, sampling), and a part
// per cell attended (Vidur's and DistServe's term for the batch's total context, which a step
// cost of tokens alone lacks).
struct step_cost {
    // defaults: SmolLM2-135M Q4_1 on this project's 2-core machine, as the server fits it under the
    // chat load of bench/mixed.py (bench/README.md, "Overload"); the server's fit starts from them
    double fixed_s        = 0.0050;
    double decode_token_s = 0.0085;
    double prompt_token_s = 0.0048;
    double attend_cell_s  = 4.5e-6;

    double seconds(const step_shape & s) const {
        return fixed_s + decode_token_s * s.n_decode + prompt_token_s * s.n_prompt + attend_cell_s * (double) s.n_attended;
    }
};

// The step cost, fitted online: least squares over the server's (or the simulator's) own steps,
// the older ones weighing less (a half-life of about 350 steps, so a change of load or of the
// machine shows within seconds), held near `prior` only in the directions the steps have not
// explored (a weak ridge toward the prior: a server that has only ever decoded one slot at a time
// still has a split of fixed and per-token cost). No part is ever negative.
class step_cost_fit {
public:
    static constexpr int     N_PARAMS     = 4;
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

// Of the generating slots, oldest first (`u` each one's marginal cost: a generated token plus the
// cells it attends), how many decode this step: the fewest k whose throughput
// thr(k) = k / (fixed + u_1 + ... + u_k) is within `loss` of the best width's. With equal u,
// thr(k) = k / (fixed + k u) rises towards 1 / u, steeply where the fixed part dominates (a GPU:
// a wide k) and hardly at all where the per-token part does (a few CPU cores: a narrow k).
// loss <= 0: every slot (no width control); at least 1 when any slot generates.
int32_t decode_width(double fixed_s, const std::vector<double> & u, double loss);

// the marginal cost of one more decoding slot whose sequence holds `n_cells` and whose step
// carries `n_tokens` (one, or one plus its draft)
double decode_slot_cost(const step_cost & c, int32_t n_cells, int32_t n_tokens);

} // namespace llama_preempt
