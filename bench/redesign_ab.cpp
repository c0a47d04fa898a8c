// The simulator and the planner alone, for a before/after comparison of csrc/policy/
// (bench/results/redesign_ab.md says how it was built and run).
#include "preempt-sim.h"
#include <chrono>
#include <cstdio>
#include <fstream>
using namespace llama_preempt;
int main(int argc, char ** argv) {
    std::vector<sim_request> reqs; std::ifstream f("/tmp/ab/wl.txt"); double t; int p, g;
    while (f >> t >> p >> g) reqs.push_back({t, p, g});
    for (long long ram : {-1LL, 0LL, 4096LL}) {
        sim_params sp; sp.n_pool = 1 << 20; sp.n_slots = 256; sp.n_batch = 2048; sp.preempt_ram_mib = ram;
        double best = 1e9; sim_result r;
        for (int rep = 0; rep < 3; ++rep) {
            auto t0 = std::chrono::steady_clock::now();
            r = simulate(reqs, sp);
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (s < best) best = s;
        }
        printf("ram %lld MiB: best of 3 %.3f s, %lld steps, %.2f us/step, swap %lld rec %lld makespan %.1f\n", ram, best, (long long) r.n_steps, 1e6 * best / r.n_steps,
               (long long) r.n_park_swap, (long long) r.n_park_recompute, r.makespan_s);
    }
    // the planner alone
    for (int n : {4, 64, 256}) {
        std::vector<slot_view> v(n);
        for (int i = 0; i < n; ++i) { v[i].id = i; v[i].phase = i % 4 == 3 ? slot_phase::parked : slot_phase::generating; v[i].n_cells = 1000 + 37 * i; v[i].n_restore = 1200; v[i].t_parked_us = i; }
        plan_params pp; pp.n_pool = 1000 * n; pp.n_batch = 2048;
        int iters = 200000 / n; auto t0 = std::chrono::steady_clock::now(); size_t sink = 0;
        for (int k = 0; k < iters; ++k) sink += plan_step(v, pp).park.size();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("plan_step %d slots: %.3f us (%zu)\n", n, 1e6 * s / iters, sink);
    }
}
