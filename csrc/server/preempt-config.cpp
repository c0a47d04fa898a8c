// llama-preempt: the server's preemption settings (preempt-config.h).
#include "preempt-config.h"

#include "common.h"
#include "ggml-backend.h"
#include "log.h"
#include "preempt-flags.h"
#include "preempt-params.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#define CFG_INF(fmt, ...) LOG_INF("srv  %12.*s: " fmt, 12, "preempt_init", __VA_ARGS__)
#define CFG_WRN(fmt, ...) LOG_WRN("srv  %12.*s: " fmt, 12, "preempt_init", __VA_ARGS__)

namespace llama_preempt {

// the keys given replace the policy's defaults (a key left out is -1 in the flag's value)
sched_params sched_from_flag(const preempt_sched_flag & f) {
    sched_params s;
    s.n_prompt_budget    = f.prompt_budget >= 0 ? (int32_t) f.prompt_budget : s.n_prompt_budget;
    s.n_restore_headroom = f.restore_headroom >= 0 ? (int32_t) f.restore_headroom : s.n_restore_headroom;
    s.n_near_finish      = f.near_finish >= 0 ? (int32_t) f.near_finish : s.n_near_finish;
    s.n_starved          = f.starved >= 0 ? (int32_t) f.starved : s.n_starved;
    s.age_step_us        = f.age_step_ms >= 0 ? f.age_step_ms * 1000 : s.age_step_us;
    s.pass_limit_us      = f.pass_limit_ms >= 0 ? f.pass_limit_ms * 1000 : s.pass_limit_us;
    s.width_loss         = f.width_loss >= 0 ? f.width_loss / 100.0 : s.width_loss;
    s.n_width            = f.width >= 0 ? (int32_t) f.width : s.n_width;
    s.max_gap_us         = f.max_gap_ms >= 0 ? f.max_gap_ms * 1000 : s.max_gap_us;
    return s;
}

static int32_t env_int(const char * name) {
    const char * env = getenv(name);
    return env ? std::max(0, atoi(env)) : 0;
}

// LLAMA_SERVER_PREEMPT_DISK_FAIL=NAME: the fault by its name (disk_fault_name())
static bool parse_disk_fault(const std::string & name, disk_fault & out) {
    for (disk_fault f : { disk_fault::none, disk_fault::write, disk_fault::read, disk_fault::remove, disk_fault::corrupt,
                          disk_fault::truncate, disk_fault::full }) {
        if (name == disk_fault_name(f)) {
            out = f;
            return true;
        }
    }
    return false;
}

size_t preempt_config::pool_cap() const {
    return knobs.route == copy_route::per_slice ? 0 : std::min<size_t>(ram_budget / 4, (size_t) 512 << 20);
}

// LLAMA_SERVER_PREEMPT_CORRUPT=bulk|graphs|slices[:park|:restore]: a route, hit by whatever means it
// takes on each device, so every device proves its own route catches a flipped byte
static bool parse_copy_corrupt(const std::string & v, copy_faults & f) {
    const size_t colon = v.find(':');
    const std::string route = v.substr(0, colon);
    const std::string dir = colon == std::string::npos ? "" : v.substr(colon + 1);
    f.corrupt_restore = dir == "restore";
    if (route == "bulk") {
        f.corrupt_route = (int) copy_route::bulk,      f.corrupt_how = how_memcpy | how_graphs;
    } else if (route == "graphs") {
        f.corrupt_route = (int) copy_route::graph,     f.corrupt_how = how_graphs;
    } else if (route == "slices") {
        f.corrupt_route = (int) copy_route::per_slice, f.corrupt_how = how_slices;
    }
    if (f.corrupt_how == 0 || !(dir.empty() || dir == "restore" || dir == "park")) {
        f.corrupt_how = 0, f.corrupt_route = -1;
        return false;
    }
    return true;
}

// flash attention on the CPU walks each sequence's runs of cells; without it, or on another device,
// libllama gathers each sequence's cells into a stream of its own (patches/0011 and 0012)
bool attn_own_cells_active(const common_params & params) {
    return params.attn_own_cells;
}

// the devices other than the CPU that layers may run on ("" where every layer runs on the CPU: -ngl 0
// or -dev none)
std::string layer_devices(const common_params & params) {
    if (params.n_gpu_layers == 0 || (!params.devices.empty() && params.devices.front() == nullptr)) {
        return "";
    }
    std::string names;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const bool used = params.devices.empty() ||
            std::find(params.devices.begin(), params.devices.end(), dev) != params.devices.end();
        if (used && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
            names += (names.empty() ? "" : ", ") + std::string(ggml_backend_dev_name(dev));
        }
    }
    return names;
}

// whether a token's attention reads every used cell of the pool, as the step cost prices it: in a
// unified pool unless each sequence attends its own cells (--attn-own-cells)
bool attention_spans_pool(const common_params & params) {
    return params.kv_unified && !attn_own_cells_active(params);
}

// --deterministic's batch-invariant kernels are the CPU's: say so where layers run on another device
// (CUDA's kernels still choose their path by the batch, so answers there can follow it)
void log_deterministic_devices(const common_params & params) {
    if (!params.batch_invariant) {
        return;
    }
    const std::string names = layer_devices(params);
    if (!names.empty()) {
        SRV_WRN("deterministic: the batch-invariant kernels are the CPU's; the layers on %s run that device's own kernels, "
                "whose answers can still follow the batch (an RPC device is batch-invariant when its ggml-rpc-server runs the "
                "CPU with GGML_CPU_BATCH_INVARIANT=1; -dev none keeps every layer on the CPU)\n", names.c_str());
    }
}

preempt_config make_preempt_config(const common_params & params, bool has_memory) {
    preempt_config cfg;
    cfg.off_why = preempt_inactive_reason(params);  // the same words /props gives
    if (cfg.off_why.empty() && !has_memory) {
        cfg.off_why = "the model has no KV memory";
    }
    cfg.on = cfg.off_why.empty();

    cfg.ram_mib    = params.preempt_ram_mib;
    cfg.host       = host_budget_from_mib(params.preempt_host_ram_mib, params.preempt_ram_mib, params.cache_ram_mib);
    cfg.ram_budget = cfg.host.parks();
    cfg.mode       = params.preempt_mode;  // read once, by the flag's parser
    cfg.disk_dir    = params.preempt_disk_dir;
    cfg.compress_q8 = params.preempt_compress_q8;
    cfg.disk_mib    = params.preempt_disk_mib;
    cfg.disk_mib_from = llama_preempt::disk_limit_from(params.preempt_disk_mib_default, params.preempt_disk_mib);
    cfg.disk_budget = cfg.disk_dir.empty() ? 0 : ram_budget_from_mib(cfg.disk_mib);
    cfg.mode = effective_mode(cfg.mode, cfg.ram_budget, cfg.disk_budget);

    cfg.sched = sched_from_flag(params.preempt_sched);

    cfg.knobs.every              = env_int("LLAMA_SERVER_PREEMPT_EVERY");
    cfg.knobs.reactive           = env_int("LLAMA_SERVER_PREEMPT_REACTIVE") > 0;
    cfg.knobs.min_parked_us            = (int64_t) env_int("LLAMA_SERVER_PREEMPT_HOLD_MS") * 1000;
    cfg.knobs.swap.fail_restore  = env_int("LLAMA_SERVER_PREEMPT_FAIL_RESTORE") > 0;
    cfg.knobs.swap.fail_alloc    = env_int("LLAMA_SERVER_PREEMPT_FAIL_ALLOC") > 0;
    // --preempt-verify: the guard checks the first N copies per device (LLAMA_SERVER_PREEMPT_VERIFY: every one)
    cfg.knobs.verify_all         = env_int("LLAMA_SERVER_PREEMPT_VERIFY") > 0;
    cfg.verify_first             = cfg.knobs.verify_all ? -1 : params.preempt_verify;
    cfg.knobs.faults.refuse_gather = env_int("LLAMA_SERVER_PREEMPT_REFUSE_GATHER") > 0;
    if (const char * env = getenv("LLAMA_SERVER_PREEMPT_CORRUPT")) {
        if (!parse_copy_corrupt(env, cfg.knobs.faults)) {
            CFG_WRN("preemption: ignoring LLAMA_SERVER_PREEMPT_CORRUPT='%s' (want bulk, graphs or slices, optionally :restore)\n", env);
        }
    }
    cfg.knobs.swap.copy_in_flight_us  = (int64_t) env_int("LLAMA_SERVER_PREEMPT_COPY_HOLD_MS") * 1000;
    cfg.knobs.swap.sync_park          = env_int("LLAMA_SERVER_PREEMPT_SYNC_PARK") > 0;

    cfg.knobs.disk.hold_us = (int64_t) env_int("LLAMA_SERVER_PREEMPT_DISK_HOLD_MS") * 1000;
    cfg.knobs.disk_always  = env_int("LLAMA_SERVER_PREEMPT_DISK_ALWAYS") > 0;
    if (const char * env = getenv("LLAMA_SERVER_PREEMPT_DISK_NAME")) {
        cfg.knobs.disk.first_name = env;
    }
    if (const char * env = getenv("LLAMA_SERVER_PREEMPT_DISK_FAIL")) {
        if (!parse_disk_fault(env, cfg.knobs.disk.fault)) {
            CFG_WRN("preemption: ignoring LLAMA_SERVER_PREEMPT_DISK_FAIL='%s' (want write, read, remove, corrupt, truncate or full)\n", env);
        }
    }

    if (const char * env = getenv("LLAMA_SERVER_PREEMPT_COPY")) {
        const std::string v = env;
        cfg.knobs.route = v == "graph" ? copy_route::graph : v == "slice" ? copy_route::per_slice : copy_route::bulk;
    }

    // LLAMA_SERVER_PREEMPT_RATES=PARK_GBPS,RESTORE_GBPS,PREFILL_TPS[,DISK_WRITE_GBPS,DISK_READ_GBPS]:
    // fixed rates for the choice (tests)
    if (const char * env = getenv("LLAMA_SERVER_PREEMPT_RATES")) {
        double park = 0, restore = 0, prefill = 0, disk_write = 0, disk_read = 0;
        const int n = sscanf(env, "%lf,%lf,%lf,%lf,%lf", &park, &restore, &prefill, &disk_write, &disk_read);
        if ((n == 3 || (n == 5 && disk_write > 0 && disk_read > 0)) && park > 0 && restore > 0 && prefill > 0) {
            cfg.rates.park_bps    = park * 1e9;
            cfg.rates.restore_bps = restore * 1e9;
            cfg.rates.prefill_tps = prefill;
            if (n == 5) {
                cfg.rates.own(park_tier::disk).out_bps = disk_write * 1e9;
                cfg.rates.own(park_tier::disk).in_bps  = disk_read * 1e9;
            }
            cfg.rates.fixed = true;
        } else {
            CFG_WRN("preemption: ignoring LLAMA_SERVER_PREEMPT_RATES='%s' (want PARK_GBPS,RESTORE_GBPS,PREFILL_TPS[,DISK_WRITE_GBPS,DISK_READ_GBPS])\n", env);
        }
    }
    return cfg;
}

void log_preempt_config(const preempt_config & cfg, size_t n_slots, int32_t n_ctx) {
    if (!cfg.on) {
        CFG_INF("preemption: off, %s\n", cfg.off_why.c_str());
        return;
    }
    // what parked slots may hold: --preempt-ram within the host budget in force (one figure, the same
    // the next line and /metrics give)
    const size_t  parks = cfg.host.parks();
    const int64_t mib   = parks == SIZE_MAX ? -1 : (int64_t) (parks >> 20);
    const bool    disk  = cfg.disk_budget > 0;
    const char *  no_ram = cfg.ram_mib == 0 ? "--preempt-ram 0" : "--host-kv-ram 0";
    const char * choose = cfg.mode == preempt_mode::automatic ? (disk ? "SWAP to RAM or disk, or RECOMPUTE, by measured cost"
                                                                      : "SWAP or RECOMPUTE by measured cost")
                                                              : "SWAP";
    const std::string disk_mib = cfg.disk_mib < 0 ? std::string("the disk's free space")
                                                  : string_format("%d MiB, %s", cfg.disk_mib, cfg.disk_mib_from.c_str());
    const std::string above = disk ? string_format("disk (%s) above it", disk_mib.c_str()) : std::string("RECOMPUTE above it");
    const std::string how = cfg.mode == preempt_mode::recompute
                              ? (mib == 0 ? string_format("RECOMPUTE only (%s)", no_ram) : std::string("RECOMPUTE only (--preempt-mode recompute)"))
                          : mib == 0 ? string_format("SWAP to disk (%s)%s, no RAM parks (%s)", disk_mib.c_str(),
                                                     cfg.mode == preempt_mode::automatic ? " or RECOMPUTE by measured cost" : "", no_ram)
                          : mib < 0 ? string_format("%s, host RAM with no limit", choose)
                          : string_format("%s within %lld MiB of host RAM, %s", choose, (long long) mib, above.c_str());
    CFG_INF("preemption: on (%s), %zu slots share a pool of %d cells; a slot is parked "
            "instead of failing every request when the pool fills\n", how.c_str(), n_slots, n_ctx);
    if (cfg.compress_q8 && cfg.mode != preempt_mode::recompute && mib != 0) {
        CFG_INF("preemption: a compressed host tier (--preempt-compress %s): a state that does not fit the RAM left "
                "may be held in host RAM packed, at about half its bytes, where that is priced below disk and a recompute; not byte-exact\n", "q8_0");
    }
    const auto as_mib = [](size_t b) { return b == SIZE_MAX ? std::string("no limit") : string_format("%zu MiB", b >> 20); };
    CFG_INF("preemption: one host budget for KV off the device (--host-kv-ram): %s, parked slots first (up to %s), "
            "the prompt cache in what they leave (up to %s), least recently used prompts giving way\n",
            as_mib(cfg.host.total).c_str(), as_mib(cfg.host.parks()).c_str(),
            cfg.host.cache_cap == 0 ? "none: --cache-ram 0" : as_mib(cfg.host.cache_cap).c_str());
    const auto & s = cfg.sched;
    CFG_INF("preemption: overload (--preempt-sched): parked requests first, then arrivals in order (aging one priority "
            "level per %lld ms, passed by later ones for at most %lld ms); prompt-budget=%d restore-headroom=%d near-finish=%d "
            "starved=%d\n", (long long) (s.age_step_us / 1000), (long long) (s.pass_limit_us / 1000), s.n_prompt_budget,
            s.n_restore_headroom, s.n_near_finish, s.n_starved);
    CFG_INF("preemption: decode width (--preempt-sched): %s; a paused slot decodes a token at least every %s\n",
            s.n_width > 0 ? string_format("%d slots decode at once (width=%d)", s.n_width, s.n_width).c_str()
            : s.width_loss <= 0 ? "every generating slot decodes (width-loss=0)"
            : string_format("the oldest slots decode, the fewest whose throughput by the measured step cost is within "
                            "%.0f %% of the best width's (width-loss=%.0f)", s.width_loss * 100, s.width_loss * 100).c_str(),
            s.max_gap_us > 0 ? string_format("%lld ms (max-gap-ms)", (long long) (s.max_gap_us / 1000)).c_str() : "- (no bound: max-gap-ms=0)");
    CFG_INF("preemption: the copy guard (--preempt-verify) checks %s\n",
            cfg.verify_first < 0 ? "every swap park and restore byte for byte"
            : cfg.verify_first == 0 ? "no swap copy"
            : string_format("the first %d swap parks and restores on each device byte for byte, and again after a device's "
                            "route changes", cfg.verify_first).c_str());
    if (cfg.knobs.route != copy_route::bulk) {
        CFG_WRN("preemption: LLAMA_SERVER_PREEMPT_COPY=%s copies swap state that way (testing and benchmarks)\n",
                copy_route_name(cfg.knobs.route));
    }
    if (cfg.rates.fixed) {
        CFG_WRN("preemption: LLAMA_SERVER_PREEMPT_RATES fixes the rates at park %.3g GB/s, restore %.3g GB/s, prefill %.0f tokens/s (testing only)\n",
                cfg.rates.park_bps / 1e9, cfg.rates.restore_bps / 1e9, cfg.rates.prefill_tps);
    }
    // the test knobs, each named once with what it does
    const struct { bool set; std::string what; } knobs[] = {
        { cfg.knobs.verify_all, "LLAMA_SERVER_PREEMPT_VERIFY checks every swap park and restore byte for byte" },
        { cfg.knobs.faults.refuse_gather, "LLAMA_SERVER_PREEMPT_REFUSE_GATHER makes every device refuse the gather graph" },
        { cfg.knobs.faults.corrupt_how != 0, string_format("LLAMA_SERVER_PREEMPT_CORRUPT flips a byte of every %s by the %s route (%s)",
                                                    cfg.knobs.faults.corrupt_restore ? "restore" : "park",
                                                    copy_route_name((copy_route) cfg.knobs.faults.corrupt_route),
                                                    copy_how_name(cfg.knobs.faults.corrupt_how)) },
        { cfg.knobs.disk.fault != disk_fault::none, string_format("LLAMA_SERVER_PREEMPT_DISK_FAIL=%s makes every disk park meet that failure",
                                                            disk_fault_name(cfg.knobs.disk.fault)) },
        { cfg.knobs.disk.hold_us > 0, string_format("LLAMA_SERVER_PREEMPT_DISK_HOLD_MS keeps each disk write in flight for %lld ms",
                                              (long long) (cfg.knobs.disk.hold_us / 1000)) },
        { cfg.knobs.disk_always, "LLAMA_SERVER_PREEMPT_DISK_ALWAYS sends every SWAP park to disk" },
        { !cfg.knobs.disk.first_name.empty(), string_format("LLAMA_SERVER_PREEMPT_DISK_NAME=%s is the disk tier's first directory name tried",
                                                      cfg.knobs.disk.first_name.c_str()) },
        { cfg.knobs.swap.copy_in_flight_us > 0, string_format("LLAMA_SERVER_PREEMPT_COPY_HOLD_MS keeps each swap copy in flight for %lld ms",
                                                        (long long) (cfg.knobs.swap.copy_in_flight_us / 1000)) },
        { cfg.knobs.swap.fail_restore, "LLAMA_SERVER_PREEMPT_FAIL_RESTORE makes every SWAP restore fail" },
        { cfg.knobs.swap.sync_park, "LLAMA_SERVER_PREEMPT_SYNC_PARK makes every park wait for its transfer (timed whole)" },
        { cfg.knobs.swap.fail_alloc, "LLAMA_SERVER_PREEMPT_FAIL_ALLOC makes every swap buffer allocation fail" },
        { cfg.knobs.min_parked_us > 0, string_format("LLAMA_SERVER_PREEMPT_HOLD_MS keeps parked slots parked for %lld ms",
                                               (long long) (cfg.knobs.min_parked_us / 1000)) },
        { cfg.knobs.reactive, "LLAMA_SERVER_PREEMPT_REACTIVE leaves parking to the KV-full retry ladder" },
        { cfg.knobs.every > 0, string_format("LLAMA_SERVER_PREEMPT_EVERY=%d parks every generating slot every %d tokens", cfg.knobs.every, cfg.knobs.every) },
    };
    for (const auto & k : knobs) {
        if (k.set) {
            CFG_WRN("preemption: %s (testing only)\n", k.what.c_str());
        }
    }
}

} // namespace llama_preempt
