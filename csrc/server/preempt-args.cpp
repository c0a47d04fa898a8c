// Our flags inside upstream's parser (preempt-args.h).
#include "preempt-args.h"

#include "preempt-flags.h"

#include <string>

namespace llama_preempt {

void preempt_add_args(common_params & params, const std::function<void(common_arg)> & add_opt) {
    add_opt(common_arg(
        {"--preempt"},
        {"--no-preempt"},
        "llama-preempt: when the unified KV pool cannot fit the next step, park a slot and resume it when room returns, "
        "instead of failing every request (default: enabled; active with --kv-unified and more than one slot)",
        [](common_params & params, bool value) {
            params.kv_preempt = value;
        }
    ).set_env("LLAMA_ARG_PREEMPT").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--preempt-ram"}, "N",
        string_format("llama-preempt: host RAM in MiB that parked slots may hold at once; a victim whose state fits "
            "is swapped to RAM (exact), the others go to --preempt-disk or are recomputed (default: %d, -1 - no limit, "
            "0 - no RAM parks: always recompute, or disk with --preempt-disk)",
            params.preempt_ram_mib),
        [](common_params & params, const std::string & value) {
            params.preempt_ram_mib = llama_preempt::parse_preempt_ram_mib(value);
        }
    ).set_env("LLAMA_ARG_PREEMPT_RAM").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--host-kv-ram"}, "N",
        "llama-preempt: one host-RAM budget in MiB for all KV that leaves the device: parked slots (capped by "
        "--preempt-ram) and the prompt cache (capped by --cache-ram) together; parked slots come first, cached prompts "
        "give way to them, least recently used first (default: the larger of --preempt-ram and --cache-ram, -1 - no limit)",
        [](common_params & params, const std::string & value) {
            params.preempt_host_ram_mib = llama_preempt::parse_host_kv_ram_mib(value);
        }
    ).set_env("LLAMA_ARG_HOST_KV_RAM").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--preempt-mode"}, "{auto,swap,recompute}",
        "llama-preempt: how a victim is parked: 'auto' takes per victim the cheapest of SWAP to RAM (its bytes over the "
        "measured copy bandwidth), SWAP to --preempt-disk (plus the measured disk rates) and RECOMPUTE (its tokens over "
        "the measured prefill rate), 'swap' swaps whatever fits --preempt-ram and the rest to disk, 'recompute' never "
        "swaps (default: auto)",
        [](common_params & params, const std::string & value) {
            params.preempt_mode = llama_preempt::parse_preempt_mode_flag(value);
        }
    ).set_env("LLAMA_ARG_PREEMPT_MODE").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--preempt-compress"}, "{none,q8_0}",
        "llama-preempt: 'q8_0' adds a tier for parked slots in host RAM compressed to q8_0 (about half the bytes of a "
        "RAM park, within --preempt-ram, for the time packing takes); not byte-exact: a resumed answer may differ from "
        "the unparked one after the park. Taken where the plain copy has no room and it is priced below disk and a recompute "
        "(default: none)",
        [](common_params & params, const std::string & value) {
            params.preempt_compress_q8 = llama_preempt::parse_preempt_compress(value);
        }
    ).set_env("LLAMA_ARG_PREEMPT_COMPRESS").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--preempt-disk"}, "DIR",
        "llama-preempt: a disk tier for parked slots: a victim whose state does not fit what is left of --preempt-ram, "
        "or that is priced cheaper on disk, is written to a file under DIR (in a subdirectory of this server's, mode "
        "0700, removed at exit) and read back on resume, byte-exact; a failed write or read recomputes (default: none)",
        [](common_params & params, const std::string & value) {
            params.preempt_disk_dir = llama_preempt::check_preempt_disk_dir(value);
        }
    ).set_env("LLAMA_ARG_PREEMPT_DISK").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--preempt-disk-mib"}, "N",
        string_format("llama-preempt: disk in MiB that the files under --preempt-disk may take, parked slots' and cached "
            "prompts' together (cached prompts give way oldest first; --cache-persist keeps at most this) (default: %s; "
            "-1 - the disk's free space, less a 64 MiB reserve)", llama_preempt::DISK_DEFAULT_RULE),
        [](common_params & params, const std::string & value) {
            params.preempt_disk_mib = llama_preempt::parse_preempt_disk_mib(value);
        }
    ).set_env("LLAMA_ARG_PREEMPT_DISK_MIB").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--max-queue"}, "N",
        "llama-preempt: at most N requests wait for a slot; another one is answered 503 with Retry-After at once, for a "
        "load balancer to send elsewhere (default: -1, no limit, as upstream: every request waits its turn)",
        [](common_params & params, const std::string & value) {
            params.preempt_max_queue = llama_preempt::parse_max_queue(value);
        }
    ).set_env("LLAMA_ARG_MAX_QUEUE").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--max-logprobs"}, "N",
        string_format("llama-preempt: the most alternatives per token a request may ask for (n_probs, top_logprobs, "
            "logprobs): more is a 400 naming the field and this limit; each costs a JSON entry per generated token "
            "(default: %d, as OpenAI's API and vLLM; -1 - no limit, upstream's behaviour)", params.preempt_max_logprobs),
        [](common_params & params, const std::string & value) {
            params.preempt_max_logprobs = llama_preempt::parse_max_logprobs(value);
        }
    ).set_env("LLAMA_ARG_MAX_LOGPROBS").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--max-body-mib"}, "N",
        string_format("llama-preempt: the largest request body the server reads, in MiB: a larger one gets 413 in the "
            "JSON error shape naming this limit, before any of it is parsed; a prompt that cannot fit the context is "
            "refused (400) before it is tokenized, whatever the body's size (default: %d; cpp-httplib's own was 100)",
            params.preempt_max_body_mib),
        [](common_params & params, const std::string & value) {
            params.preempt_max_body_mib = llama_preempt::parse_max_body_mib(value);
        }
    ).set_env("LLAMA_ARG_MAX_BODY_MIB").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--read-deadline"}, "N",
        string_format("llama-preempt: a request's line, headers and body must all arrive within N seconds of its first "
            "byte, however each read is paced: a connection that sends half a request (or dribbles its body) is closed "
            "then instead of holding an HTTP thread for --timeout (default: %d; 0 - no deadline, upstream's behaviour)",
            params.preempt_read_deadline_s),
        [](common_params & params, const std::string & value) {
            params.preempt_read_deadline_s = llama_preempt::parse_http_limit(value, "--read-deadline", 0,
                                                                            "seconds from 0 (no deadline) to 1000000");
        }
    ).set_env("LLAMA_ARG_READ_DEADLINE").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--keep-alive-timeout"}, "N",
        string_format("llama-preempt: an idle keep-alive connection is closed after N seconds without a request "
            "(default: %d, cpp-httplib's)", params.preempt_keep_alive_s),
        [](common_params & params, const std::string & value) {
            params.preempt_keep_alive_s = llama_preempt::parse_http_limit(value, "--keep-alive-timeout", 1,
                                                                         "seconds from 1 to 1000000");
        }
    ).set_env("LLAMA_ARG_KEEP_ALIVE_TIMEOUT").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--max-connections"}, "N",
        string_format("llama-preempt: at most N HTTP connections open at once (each has a thread); one more is answered "
            "503 at once and closed, taking no thread from the others (default: %d; 0 - no cap)",
            params.preempt_max_connections),
        [](common_params & params, const std::string & value) {
            params.preempt_max_connections = llama_preempt::parse_http_limit(value, "--max-connections", 0,
                                                                            "a count from 0 (no cap) to 1000000");
        }
    ).set_env("LLAMA_ARG_MAX_CONNECTIONS").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--stall-timeout"}, "N",
        string_format("llama-preempt: a response whose client reads nothing for N seconds (its socket full) is ended: "
            "its request is cancelled and its cells freed; a client that reads, however slowly, and a parked request's "
            "stream (its keepalive notices are read) are never cut (default: %d; 0 - --timeout)",
            params.preempt_stall_timeout_s),
        [](common_params & params, const std::string & value) {
            params.preempt_stall_timeout_s = llama_preempt::parse_http_limit(value, "--stall-timeout", 0,
                                                                            "seconds from 0 (--timeout) to 1000000");
        }
    ).set_env("LLAMA_ARG_STALL_TIMEOUT").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--prefix-share"},
        {"--no-prefix-share"},
        "llama-preempt: a new request's prompt links the longest prefix another slot holds in the unified pool (a system "
        "prompt, a document, the prompt of an n>1 request) instead of evaluating it again: the cells are held once, by "
        "every request that shares them, and a park frees only the cells no other request holds (default: enabled; not "
        "for recurrent, hybrid or sliding-window models, nor with a draft or MTP context)",
        [](common_params & params, bool value) {
            params.preempt_share_prefix = value;
        }
    ).set_env("LLAMA_ARG_PREFIX_SHARE").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--cache-persist"},
        "llama-preempt: keep the prompt cache's disk tier across restarts: at a clean exit the cached prompts' files in "
        "--preempt-disk DIR stay, and the next server with the same model file and KV-relevant flags takes them back "
        "(a returning long prompt then skips its prefill); the caches of other models or flags are removed (default: off)",
        [](common_params & params) {
            params.preempt_cache_persist = true;
        }
    ).set_env("LLAMA_ARG_CACHE_PERSIST").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--preempt-keepalive"}, "SEC",
        string_format("llama-preempt: while a streamed request is parked, send the SSE comment ': preempt-keepalive' every SEC "
            "seconds so clients and proxies do not time out (default: %d, 0 - off)", params.preempt_keepalive_s),
        [](common_params & params, int value) {
            params.preempt_keepalive_s = llama_preempt::check_preempt_keepalive(value);
        }
    ).set_env("LLAMA_ARG_PREEMPT_KEEPALIVE").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--preempt-sched"}, "KEY=N,...",
        "llama-preempt: how an overloaded pool is shared (docs/operators.md, \"Overload\"): prompt-budget (prompt tokens "
        "a step adds while other slots generate, so a long prompt does not stall their decode; 0 - up to -b; default 256), "
        "restore-headroom (cells per running slot a resume leaves free, so it is not parked again at once; default 8), "
        "near-finish (a slot with this many tokens or fewer left is parked last; default 16), starved (a slot parked this "
        "often is parked last; default 3), age-step-ms (a waiting request rises one priority level per this much waiting; "
        "default 10000, 0 - no aging), pass-limit-ms (a new request that does not fit may be passed by later ones for this "
        "long, then it holds them; default 5000, 0 - strict arrival order), width-loss (the oldest slots decode, the fewest "
        "whose throughput by the measured step cost is within this percent of the best width's, the rest pause; default 5, "
        "0 - every slot decodes), width (a fixed number of slots decode; 0 - by width-loss), max-gap-ms (a paused stream "
        "gets a token at least this often; default 3000, 0 - no bound)",
        [](common_params & params, const std::string & value) {
            params.preempt_sched = llama_preempt::parse_preempt_sched(value);
        }
    ).set_env("LLAMA_ARG_PREEMPT_SCHED").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--preempt-verify"}, "N",
        string_format("llama-preempt: the copy guard: the first N swap parks and N restores on each device are checked "
            "byte for byte against upstream's own copy (and again after a device's route changes); a difference moves that "
            "device to the per-slice copy (or turns SWAP off), and the request is recomputed instead of resumed on bad state "
            "(default: %d, 'always' - every copy, 'never' - none)", params.preempt_verify),
        [](common_params & params, const std::string & value) {
            params.preempt_verify = llama_preempt::parse_preempt_verify(value);
        }
    ).set_env("LLAMA_ARG_PREEMPT_VERIFY").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--preempt-selftest"},
        "llama-preempt: load the model with the other flags given, check every park route this build and device can take "
        "(SWAP by device graphs, by slices, to disk, restore ahead, RECOMPUTE) byte for byte and against the unparked "
        "answer, print a table and a report for bug reports, and exit: 0 when every route is right, 1 otherwise "
        "(also: llama-preempt doctor)",
        [](common_params & params) {
            params.preempt_selftest = true;
        }
    ).set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--drain-timeout"}, "SEC",
        string_format("llama-preempt: on SIGTERM or SIGINT, stop taking requests (503, and /health answers 503 "
            "\"draining\"), let the requests in flight finish for up to SEC seconds, end the rest with an error, "
            "then exit 0; a second signal ends the drain at once (default: %d, 0 - end them at once)",
            params.drain_timeout_s),
        [](common_params & params, int value) {
            params.drain_timeout_s = llama_preempt::check_drain_timeout(value);
        }
    ).set_env("LLAMA_ARG_DRAIN_TIMEOUT").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--deterministic"},
        "llama-preempt: the same answer whatever runs beside it and however it is parked: batch-invariant CPU kernels "
        "(no sgemm, tiled or repacked matmuls, one-chunk flash attention visiting each sequence's cells by position), "
        "so a request's tokens at temperature 0 (or with a fixed seed) do not depend on the other requests, the batch "
        "sizes, a SWAP or RECOMPUTE park or the prompt cache; turns flash attention on (default: disabled)",
        [](common_params & params) {
            params.batch_invariant = true;
        }
    ).set_env("LLAMA_ARG_DETERMINISTIC").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--attn-own-cells"}, {"--no-attn-own-cells"},
        "llama-preempt: attention visits only each request's own cells of the shared pool, not every cell up to the "
        "pool's highest used one, so many slots in one pool cost what the static split costs: the CPU's flash attention "
        "walks runs of cells built once per batch; without flash attention, or with the KV on a GPU, each request's "
        "cells are gathered into a stream of their own. The same answers as visiting every cell (byte for byte under "
        "--deterministic); --no-attn-own-cells visits the whole span, as upstream (default: enabled)",
        [](common_params & params, bool value) {
            params.attn_own_cells = value;
        }
    ).set_env("LLAMA_ARG_ATTN_OWN_CELLS").set_examples({LLAMA_EXAMPLE_SERVER}));
}

} // namespace llama_preempt
