// llama-preempt: the step's batch as preemption shapes it, a unit of its own behind the port
// (preempt-port.h): what the plan holds back and how many prompt or replay tokens each slot adds
// (the plan's chunks and prompt budget), a resuming slot's replay chunks, what a step counts as
// recompute, the rewind of the KV-full retry ladder's last resort, and the step cost measured from
// this server's own steps.
//
// It owns the plan's per-slot shape of the step and the step cost's fit, and is handed the port
// (the slots and the batch being built), upstream's metrics and the Engine's step log.
#pragma once

#include "preempt-policy.h"
#include "preempt-port.h"
#include "preempt-step-recorder.h"
#include "preempt-width.h"

#include "server-common.h"  // server_metrics

#include "ggml.h"  // ggml_time_us()

#include <cstdint>
#include <vector>

namespace llama_preempt {

class batch_hooks {
public:
    batch_hooks(batch_port & port, slot_table & table, server_metrics & metrics, step_recorder & steps)
        : port_(port), table_(table), metrics_(metrics), steps_(steps) {}

    // whether a token's attention spans the pool's used cells (a unified pool whose attention does not
    // walk each sequence's own cells), once the parameters are final
    void set_spans_pool(bool spans) { spans_pool_ = spans; }

    // before the plan: no slot held, no chunk given
    void begin() {
        hold_.assign(port_.n_slots(), 0);
        chunk_.assign(port_.n_slots(), -1);
    }
    void hold(int32_t id) { hold_[id] = 1; }                 // a prompt kept waiting this step
    void chunk(int32_t id, int32_t n) { chunk_[id] = n; }    // the prompt or replay tokens it may add (-1: up to n_batch)

    // the plan, before it is carried out: its prompt budget and decode width (and resumes may come again)
    void planned(const plan & pl) {
        parked_last_resort_ = false;
        prompt_budget_      = pl.n_prompt_budget;
        width_              = pl.n_decode_width;
        limited_            = !pl.pause.empty();
    }

    // a step begins (before its plan): the loop's time since the last step ended is the rest of the
    // loop's (loop_part), and closes that step's period: the step cost's sample is the whole period
    // (its decode, post-decode and the rest of the loop), the step's real time as a client sees it
    void loop_begin() {
        const int64_t now = ggml_time_us();
        if (t_end_ > 0) {
            const int64_t other = now - t_end_;
            metrics_.preempt.loop_us[LOOP_OTHER] += (uint64_t) other;
            if (pending_) {
                const double t_s = (double) (pending_us_ + other) / 1e6;
                fit_.observe(pending_shape_, t_s);
                guard_.observe(pending_shape_.n_decode, t_s, pending_limited_, width_loss_);
            }
        }
        pending_ = false;
        t_end_   = 0;
        t_plan0_ = now;
    }

    // the plan was carried out: the step's cost is measured from here (its copies are not part of it)
    void measure();

    // the step just decoded: its parts timed, and (a step the last resort retried left out) one sample
    // of the step cost once the loop comes round to the next step
    void step_end() {
        const int64_t now = ggml_time_us();
        if (t_step0_ > 0) {
            metrics_.preempt.loop_us[LOOP_POST] += (uint64_t) (now - t_mark_);
            metrics_.preempt.n_loop_steps_total++;
            t_end_ = now;
        }
        pending_ = step_clean_ && t_step0_ > 0 && step_now_.n_decode + step_now_.n_prompt > 0;
        if (pending_) {
            pending_shape_   = step_now_;
            pending_us_      = now - t_step0_;
            pending_limited_ = limited_;
        }
        t_step0_    = 0;
        step_now_   = {};
        step_clean_ = false;
    }

    // every slot idle: the loop waits for work, which is no step's time
    void idle() {
        pending_ = false;
        t_end_   = 0;
    }

    // the last resort parked a victim: nothing resumes before the retried step, whose copies are no price of a batch
    void parked_by_last_resort() {
        parked_last_resort_ = true;
        step_clean_         = false;
    }
    bool parked_last_resort() const { return parked_last_resort_; }

    int32_t width() const { return width_; }                           // the last plan's decode width
    const step_cost_fit & fit() const { return fit_; }  // what a step costs, fitted from this server's steps
    const width_guard & guard() const { return guard_; }  // the width rule's live check
    void set_width_loss(double loss) { width_loss_ = loss; }           // --preempt-sched width-loss

    bool prompt_hook(int32_t id, int32_t & n_batch, bool & add_ok);
    void count_decoded(int32_t off, int32_t n_tokens);
    bool rewind(int32_t off);

    // no progress chunks while a slot redoes work it had done: the client saw that progress already
    bool mute_progress(int32_t id) const {
        const auto & ps = table_[id];
        return ps.resuming || ps.n_redo_left > 0;
    }

private:
    bool add_replay(int32_t id, int32_t n_batch);

    batch_port &     port_;
    slot_table &     table_;
    server_metrics & metrics_;
    step_recorder &  steps_;

    std::vector<uint8_t> hold_;              // per slot: a prompt kept waiting this step
    std::vector<int32_t> chunk_;             // per slot: the prompt or replay tokens it may add this step (-1: up to n_batch)
    int32_t prompt_budget_      = 0;         // the last plan's prompt budget (0: up to n_batch)
    int32_t width_              = 0;         // the last plan's decode width
    bool    parked_last_resort_ = false;     // the retry ladder parked in the last step: resume nothing now
    step_cost_fit fit_;       // what a step costs, fitted from this server's own steps (the decode width)
    // the step being measured for the fit: its start (once the plan is carried out), its batch's
    // shape as the decodes count it, and whether it is the price of a batch alone (no park, resume or
    // retry in it, whose copies the fit must not take for decode time)
    int64_t t_step0_ = 0;
    step_shape step_now_;
    bool step_clean_ = false;
    // the loop's clock (loop_part): when the plan began, the last mark within the step (its decode
    // counted), when the step ended; and the step whose period the next loop_begin() closes
    int64_t t_plan0_ = 0;
    int64_t t_mark_  = 0;
    int64_t t_end_   = 0;
    bool    pending_ = false;
    step_shape pending_shape_;
    int64_t pending_us_ = 0;
    int64_t n_pool_used_ = 0;   // cells the slots held as the step began
    bool    spans_pool_ = true; // a token's attention spans the pool's used cells, not its own
    // the width rule's live check: whether the last plan paused a slot, the pending step's, the loss allowed
    width_guard guard_;
    bool    limited_ = false;
    bool    pending_limited_ = false;
    double  width_loss_ = 0.05;
};

} // namespace llama_preempt
