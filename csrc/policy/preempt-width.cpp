// The step cost fitted online and the decode width read from it (preempt-width.h).
#include "preempt-width.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace llama_preempt {

// the fit's features: the attended cells in thousands and the spanned in millions, so that the
// columns are of similar size and the normal equations stay well conditioned
static void features(const step_shape & s, double x[step_cost_fit::N_PARAMS]) {
    x[0] = 1.0;
    x[1] = s.n_decode;
    x[2] = s.n_prompt;
    x[3] = (double) s.n_attended / 1000.0;
    x[4] = (double) s.n_spanned / 1e6;
}

static step_cost from_params(const double th[step_cost_fit::N_PARAMS]) {
    step_cost c;
    c.fixed_s        = th[0];
    c.decode_token_s = th[1];
    c.prompt_token_s = th[2];
    c.attend_cell_s  = th[3] / 1000.0;
    c.span_cell_s    = th[4] / 1e6;
    return c;
}

// the prior's weight per part: a ridge toward the prior, each part weighed at a typical size of its
// feature (one step; 4 generated tokens; 64 prompt tokens; 10 thousand cells attended; a million
// cells spanned), so that it pins only what the steps leave open and has no leverage on what they show
static const double k_prior_scale[step_cost_fit::N_PARAMS] = { 1.0, 4.0, 64.0, 10.0, 1.0 };

step_cost_fit::step_cost_fit(const step_cost & prior) : prior(prior), fitted(prior) {}

void step_cost_fit::observe(const step_shape & s, double t_s) {
    if (!(t_s > 0) || !std::isfinite(t_s) || (s.n_decode <= 0 && s.n_prompt <= 0)) {
        return;
    }
    if (ready() && t_s > 10.0 * fitted.seconds(s)) {
        return;  // a stall, not the price of the step
    }
    double x[N_PARAMS];
    features(s, x);
    for (int i = 0; i < N_PARAMS; ++i) {
        for (int j = 0; j < N_PARAMS; ++j) {
            xtx[i][j] = xtx[i][j] * FORGET + x[i] * x[j];
        }
        xty[i] = xty[i] * FORGET + x[i] * t_s;
    }
    n++;
    solve();
}

// Solve the n x n system a * th = b in place (Gaussian elimination with partial pivoting);
// false when it is singular.
static bool solve_linear(int n, double a[step_cost_fit::N_PARAMS][step_cost_fit::N_PARAMS], double b[], double th[]) {
    for (int c = 0; c < n; ++c) {
        int piv = c;
        for (int r = c + 1; r < n; ++r) {
            if (std::fabs(a[r][c]) > std::fabs(a[piv][c])) {
                piv = r;
            }
        }
        if (std::fabs(a[piv][c]) < 1e-300) {
            return false;
        }
        if (piv != c) {
            std::swap(a[piv], a[c]);
            std::swap(b[piv], b[c]);
        }
        for (int r = c + 1; r < n; ++r) {
            const double f = a[r][c] / a[c][c];
            for (int k = c; k < n; ++k) {
                a[r][k] -= f * a[c][k];
            }
            b[r] -= f * b[c];
        }
    }
    for (int r = n - 1; r >= 0; --r) {
        double v = b[r];
        for (int k = r + 1; k < n; ++k) {
            v -= a[r][k] * th[k];
        }
        th[r] = v / a[r][r];
    }
    return true;
}

void step_cost_fit::solve() {
    // the steps' sums plus the ridge toward the prior
    double m[N_PARAMS][N_PARAMS];
    double v[N_PARAMS];
    for (int i = 0; i < N_PARAMS; ++i) {
        v[i] = xty[i];
        for (int j = 0; j < N_PARAMS; ++j) {
            m[i][j] = xtx[i][j];
        }
    }
    double th0[N_PARAMS];
    {
        const step_cost & c = prior;
        th0[0] = c.fixed_s;
        th0[1] = c.decode_token_s;
        th0[2] = c.prompt_token_s;
        th0[3] = c.attend_cell_s * 1000.0;
        th0[4] = c.span_cell_s * 1e6;
    }
    for (int i = 0; i < N_PARAMS; ++i) {
        const double w = PRIOR_WEIGHT * k_prior_scale[i] * k_prior_scale[i];
        m[i][i] += w;
        v[i]    += w * th0[i];
    }

    // non-negative least squares by an active set: a part that comes out negative is held at 0
    // and the rest solved again (one round per part at most)
    bool zero[N_PARAMS] = {};
    double th[N_PARAMS] = {};
    for (int round = 0; round < N_PARAMS; ++round) {
        int idx[N_PARAMS];
        int k = 0;
        for (int i = 0; i < N_PARAMS; ++i) {
            if (!zero[i]) {
                idx[k++] = i;
            }
        }
        double a[N_PARAMS][N_PARAMS];
        double b[N_PARAMS];
        double sol[N_PARAMS] = {};
        for (int r = 0; r < k; ++r) {
            b[r] = v[idx[r]];
            for (int c = 0; c < k; ++c) {
                a[r][c] = m[idx[r]][idx[c]];
            }
        }
        if (k == 0 || !solve_linear(k, a, b, sol)) {
            return;  // keep the last fit
        }
        int most_negative = -1;
        for (int r = 0; r < k; ++r) {
            if (sol[r] < 0 && (most_negative < 0 || sol[r] < sol[most_negative])) {
                most_negative = r;
            }
        }
        if (most_negative < 0) {
            std::fill(th, th + N_PARAMS, 0.0);
            for (int r = 0; r < k; ++r) {
                th[idx[r]] = sol[r];
            }
            fitted = from_params(th);
            return;
        }
        zero[idx[most_negative]] = true;
    }
}

double decode_slot_cost(const step_cost & c, int32_t n_cells, int32_t n_tokens, int64_t n_span) {
    const int32_t t = std::max(1, n_tokens);
    // its tokens sit at positions n_cells .. n_cells + t - 1 and read n_cells + 1 .. n_cells + t cells
    const double attended = (double) t * n_cells + (double) t * (t + 1) / 2;
    const double spanned  = (double) t * (double) std::max<int64_t>(n_span, n_cells + t);
    return c.decode_token_s * t + c.attend_cell_s * attended + c.span_cell_s * spanned;
}

void width_guard::observe(int32_t n_decode, double t_s, bool limited, double loss) {
    if (!(t_s > 0) || !std::isfinite(t_s)) {
        return;
    }
    if (hold_left > 0) {
        hold_left--;
        return;
    }
    if (phase == phase_t::probe) {
        probe_tokens += n_decode;
        probe_s      += t_s;
        if (++probe_steps < WINDOW) {
            return;
        }
        probes++;
        limited_tps = lim_s > 0 ? lim_tokens / lim_s : 0;
        full_tps    = probe_s > 0 ? probe_tokens / probe_s : 0;
        // the limited width may give up `loss` of what every slot decoding delivers, no more
        if (full_tps > 0 && limited_tps < (1.0 - std::max(0.0, loss)) * full_tps) {
            fallbacks++;
            hold_left   = HOLD;
            probe_every = PROBE_EVERY;  // after the hold, checked again soon
        } else {
            probe_every = std::min(PROBE_MAX, 2 * probe_every);
        }
        phase = phase_t::limited;
        since_probe = 0;
        win_tokens = win_s = 0;
        win_steps = 0;
        return;
    }
    if (!limited) {
        return;  // every slot decoded anyway: nothing to compare
    }
    // the last WINDOW limited steps, restarted each WINDOW steps (the window compared is the one just
    // before the probe, or the one before it when it has just started)
    if (win_steps == WINDOW) {
        lim_tokens = win_tokens, lim_s = win_s;
        win_tokens = win_s = 0;
        win_steps = 0;
    }
    win_tokens += n_decode;
    win_s      += t_s;
    win_steps++;
    if (++since_probe >= probe_every && win_steps == WINDOW) {
        lim_tokens = win_tokens, lim_s = win_s;
        phase = phase_t::probe;
        probe_tokens = probe_s = 0;
        probe_steps = 0;
    }
}

int32_t decode_width(double fixed_s, const std::vector<double> & u, double loss) {
    const int32_t n = (int32_t) u.size();
    if (n == 0) {
        return 0;
    }
    if (loss <= 0) {
        return n;
    }
    const double a = std::max(0.0, fixed_s);
    std::vector<double> thr(n);
    double t = a;
    double best = 0;
    for (int32_t k = 1; k <= n; ++k) {
        t += std::max(0.0, u[k - 1]);
        thr[k - 1] = t > 0 ? k / t : std::numeric_limits<double>::infinity();
        best = std::max(best, thr[k - 1]);
    }
    for (int32_t k = 1; k <= n; ++k) {
        if (thr[k - 1] >= (1.0 - loss) * best) {
            return k;
        }
    }
    return n;
}

} // namespace llama_preempt
