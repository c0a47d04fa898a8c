// llama_preempt._core.Engine: the patched llama-server in this process, its loop driven by Python.
//
// - The model is loaded by upstream's own argument parser and server_context::load_model(), so
//   every llama-server flag works.
// - The parameters are finalised by upstream's own server_prepare_params() (tools/server/server.cpp,
//   made callable by patches/0005-engine.patch), as llama-server finalises them.
// - Requests go through upstream's own route handlers (server_routes), each on its own thread as
//   an HTTP request would be, with a JSON body and no socket: parameter parsing, chat templates,
//   sampling and response shapes are the server's. The route table is upstream's, read from its
//   server.cpp at build time, and each handler is wrapped in upstream's own ex_wrapper().
// - step() runs one iteration of upstream's loop (server_context::step()) on the calling thread
//   with the GIL released, and returns what happened in it as typed events (preempt-events.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "arg.h"
#include "common.h"
#include "llama.h"
#include "log.h"
#include "server-common.h"
#include "server-context.h"
#include "server-http.h"

#include "preempt-params.h"
#include "preempt-notice.h"
#include "py-enums.h"
#include "py-engine-request.h"
#include "py-json.h"
#include "py-model.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace py = pybind11;
namespace lp = llama_preempt;

namespace {

struct engine_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct engine_closed_error : engine_error {
    using engine_error::engine_error;
};
struct engine_busy_error : engine_error {
    using engine_error::engine_error;
};
struct model_load_error : engine_error {
    using engine_error::engine_error;
};
struct engine_argument_error : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

// flags whose upstream handlers print and exit the process: an embedding host must not die
const char * const k_exiting_flags[] = {
    "-h", "--help", "--usage", "--version", "--completion-bash", "--list-devices", "-cl", "--cache-list", "--preempt-selftest",
};

server_http_res_ptr not_found(const std::string & method, const std::string & path) {
    auto res    = std::make_unique<server_http_res>();
    res->status = 404;
    res->data   = safe_json_to_str({{"error", {
        {"code", 404}, {"message", "no route for " + method + " " + path}, {"type", "not_found_error"}}}});
    return res;
}

class engine {
public:
    explicit engine(const std::vector<std::string> & args) {
        for (const auto & a : args) {
            for (const char * f : k_exiting_flags) {
                if (a == f) {
                    throw engine_argument_error(std::string("error: ") + f + " is not available in the Engine (it prints and exits); "
                                                "run `llama-server " + f + "` instead");
                }
            }
        }
        init_process();

        std::vector<std::string> argv_s = { "llama-server" };
        argv_s.insert(argv_s.end(), args.begin(), args.end());
        std::vector<char *> argv;
        for (auto & a : argv_s) {
            argv.push_back(a.data());
        }
        {
            auto ctx_arg = common_params_parser_init(params, LLAMA_EXAMPLE_SERVER);
            const common_params defaults = params;
            try {
                if (!common_params_parse_ex((int) argv.size(), argv.data(), ctx_arg)) {
                    throw engine_argument_error("error: invalid arguments");
                }
                params.lr.init();
            } catch (const std::exception & e) {  // upstream's parser throws std::invalid_argument, and others
                params = defaults;
                // its first paragraph: the flag, the value and what is wrong with it (then comes the
                // usage text of a terminal, which the exception's one line cannot hold)
                const std::string what = string_strip(e.what());
                throw engine_argument_error(what.substr(0, what.find("\n\n")));
            }
        }

        params.ui = false;  // no HTTP server, so no web UI: /props must not say there is one

        if (params.model.path.empty()) {
            throw engine_argument_error("error: the Engine needs a local model file: pass -m PATH (nothing is downloaded)");
        }
        if (!std::filesystem::is_regular_file(params.model.path)) {
            throw model_load_error("model file not found: " + params.model.path);
        }

        // what llama_server() does to the parsed params before it loads the model: upstream's own
        // function (tools/server/server.cpp, made callable by the patches), which prints a refusal
        std::string refusal;  // raised, not printed
        if (server_prepare_params(params, /* is_router_server = */ false, &refusal) != 0) {
            throw engine_argument_error("error: " + refusal);  // llama.cpp would assert
        }

        ctx = std::make_unique<server_context>();
        routes = std::make_unique<server_routes>(params, *ctx);  // before load_model(), as upstream does
        bool loaded = false;
        {
            py::gil_scoped_release nogil;
            loaded = ctx->load_model(params);
        }
        if (!loaded) {
            routes.reset();
            ctx.reset();
            throw model_load_error("failed to load the model from " + params.model.path +
                                   " (not a GGUF llama.cpp can load, or it does not fit; see the log above)");
        }
        routes->update_meta(*ctx);
        build_route_table();
        waker->wake = [c = ctx.get()]() { c->wake_readers(); };
        ctx->step_begin();
        looping = true;
        publish(snap_stats);
        publish(snap_views);
    }

    ~engine() {
        try {
            close();
        } catch (...) {
        }
    }

    engine(const engine &) = delete;
    engine & operator=(const engine &) = delete;

    // start a request: an upstream route handler runs on its own thread, as under HTTP. With
    // wait_queued, return only once its task is queued (or it answered without one): the caller
    // owns the loop, so the tasks of requests submitted one after another all wait for its next
    // step, and a batch runs together as it would have had its requests arrived at once
    std::shared_ptr<engine_request> submit(const std::string & method, const std::string & target, const std::string & body,
                                           bool wait_queued) {
        check_open();
        auto req = std::make_shared<engine_request>();

        std::string path  = target;
        std::string query;
        if (const auto q = target.find('?'); q != std::string::npos) {
            path  = target.substr(0, q);
            query = target.substr(q + 1);
        }
        std::map<std::string, std::string> params_kv = parse_query_string(query);
        const server_http_context::handler_t * handler = find_route(method, path, params_kv);

        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> lk_submit(mtx_submit);  // one submit at a time: the count below is ours
        req->id     = ++n_submitted;
        req->notify = notifier;
        req->waker  = waker;
        const size_t n_before = ctx->step_wait(0);
        {
            std::lock_guard<std::mutex> lk(mtx_requests);
            reap_finished();
            auto h = handler ? *handler : server_http_context::handler_t{};
            threads.push_back({ req, std::thread([this, req, h, method, path, query, params_kv, body]() {
                run_request(*req, h, method, path, query, params_kv, body);
            }) });
        }
        if (wait_queued) {
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
            while (ctx->step_wait(1) <= n_before && std::chrono::steady_clock::now() < deadline) {
                std::lock_guard<std::mutex> lk(req->mtx);
                if (req->started || req->done) {
                    break;  // answered (an error, or a route that needs no task), or another thread stepped
                }
            }
        }
        return req;
    }

    llama_preempt::step_report step() {
        check_open();
        if (in_step.exchange(true)) {
            throw engine_busy_error("step() is already running on another thread: drive the loop from one thread "
                                    "(or use start() and let the background thread do it)");
        }
        struct clear_flag {
            std::atomic<bool> & f;
            ~clear_flag() { f = false; }
        } clear{ in_step };
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> lk(mtx_step);  // stats() may be reading the slots
        auto rep = ctx->step();
        // for the calls made while a step runs: a fresh snapshot when one found this step running
        // (and took the one before), else the stats at most every 20 ms (a few tens of us each),
        // and the /slots and /metrics views, dearer, every 100 ms once they were asked for
        const int64_t now = now_us();
        if (snap_stats.wanted.exchange(false) || now - snap_stats.t_us.load() > 20000) {
            publish(snap_stats);
        }
        if (snap_views.wanted.exchange(false) || (snap_views.used && now - snap_views.t_us.load() > 100000)) {
            publish(snap_views);
        }
        return rep;
    }

    // wait until a task is queued or a request finished, at most timeout_s; true if either happened
    bool wait(double timeout_s) {
        check_open();
        py::gil_scoped_release nogil;
        const auto deadline = std::chrono::steady_clock::now() +
            std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(std::max(0.0, timeout_s)));
        while (true) {
            if (n_finished.load() != n_finished_seen) {
                n_finished_seen = n_finished.load();
                return true;
            }
            if (ctx->step_wait(0) > 0) {
                return true;
            }
            const auto now = std::chrono::steady_clock::now();
            if (now >= deadline) {
                return false;
            }
            // a queued task wakes this at once; a finished request within 2 ms
            const auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
            if (ctx->step_wait(std::max<int64_t>(1, std::min<int64_t>(left_ms, 2))) > 0) {
                return true;
            }
        }
    }

    // The stats as of the last step boundary, never waiting for a step: between steps they are
    // read now; while a step runs (a long prefill can take seconds) the snapshot published at the
    // end of a step before is returned, and the running step publishes a fresh one when it ends.
    // age_ms: how old they are; while_stepping: a step was running. Typed (preempt-stats.h).
    lp::engine_stats stats() {
        bool while_stepping = false;
        double age_ms = 0;
        auto st = read_snapshot(snap_stats, while_stepping, age_ms);
        st.while_stepping = while_stepping;
        st.age_ms         = age_ms;
        return st;
    }

    // upstream's /slots entries and /metrics text, the same way: {"slots", "metrics_text", "age_ms", ...}
    py::object views() {
        snap_views.used = true;
        bool while_stepping = false;
        double age_ms = 0;
        json out = read_snapshot(snap_views, while_stepping, age_ms);
        out["while_stepping"] = while_stepping;
        out["age_ms"]         = age_ms;
        return to_python(out);
    }

    // The read end of a pipe that carries, 8 bytes each, the ids of requests with news (submitted
    // from now on); made once. What an event loop watches instead of polling (AsyncEngine).
    int notify_fd() {
        check_open();
        std::lock_guard<std::mutex> lk(mtx_submit);
        if (!notifier) {
            int fds[2];
            if (pipe(fds) != 0) {
                throw engine_error(std::string("cannot make the notify pipe: ") + strerror(errno));
            }
            for (int fd : fds) {  // pipe2() is Linux's: the flags one by one, as macOS needs
                fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
                fcntl(fd, F_SETFD, FD_CLOEXEC);
            }
            notify_read_fd   = fds[0];
            auto n           = std::make_shared<engine_notifier>();
            n->fd            = fds[1];
            notifier         = n;
        }
        return notify_read_fd;
    }

    // whether the pipe lost news since the last call (it was full): look at every request then
    bool take_missed() {
        std::lock_guard<std::mutex> lk(mtx_submit);  // close() lets the notifier go
        return notifier && notifier->missed.exchange(false);
    }

    size_t n_queued() {
        check_open();
        return ctx->step_wait(0);
    }

    int n_pending() {
        std::lock_guard<std::mutex> lk(mtx_requests);
        int n = 0;
        for (auto & t : threads) {
            std::lock_guard<std::mutex> lk_req(t.req->mtx);
            n += t.req->done ? 0 : 1;
        }
        return n;
    }

    bool is_closed() const { return closed; }

    const llama_context * lctx() const { check_open(); return ctx->get_llama_context(); }  // for py-model.cpp
    py::list fields() const { return request_fields(params); }  // this server's limits (n up to its slots)

    // cancel what is pending, wait for the handler threads, stop the loop's worker, free the model
    void close() {
        if (closed) {
            return;
        }
        closed = true;
        py::gil_scoped_release nogil;
        std::vector<running_request> to_join;
        {
            std::lock_guard<std::mutex> lk(mtx_requests);
            for (auto & t : threads) {
                t.req->cancelled = true;
                t.req->cv.notify_all();
            }
            to_join.swap(threads);
        }
        if (ctx) {
            ctx->wake_readers();  // each handler notices its cancel now and returns
        }
        for (auto & t : to_join) {
            if (t.thread.joinable()) {
                t.thread.join();
            }
        }
        std::lock_guard<std::mutex> lk(mtx_step);
        if (looping) {
            ctx->step_end();
            looping = false;
        }
        {
            std::lock_guard<std::mutex> lk_wake(waker->mtx);
            waker->wake = nullptr;  // a handle that outlives the Engine cancels nothing here any more
        }
        table.clear();
        routes.reset();
        ctx.reset();
        std::lock_guard<std::mutex> lk_submit(mtx_submit);
        if (notifier) {  // every handler has returned: nobody writes any more
            ::close(notifier->fd);
            ::close(notify_read_fd);
            notifier->fd   = -1;
            notify_read_fd = -1;
            notifier.reset();
        }
    }

private:
    struct running_request {
        std::shared_ptr<engine_request> req;
        std::thread thread;
    };

    common_params                   params;
    std::unique_ptr<server_context> ctx;
    std::unique_ptr<server_routes>  routes;
    std::map<std::string, server_http_context::handler_t> table;  // "POST /completion" -> handler

    std::mutex                   mtx_step;      // held by step(); stats() reads between steps
    // what stats() and views() answer while a step runs: as of a step boundary
    template <typename T> struct snapshot {
        std::mutex           mtx;
        T                    data;
        std::atomic<int64_t> t_us{0};         // when it was taken (now_us())
        std::atomic<bool>    wanted{false};   // a call found a step running: publish at its end
        std::atomic<bool>    used{false};     // asked for at least once (the views: publish them on)
    };
    snapshot<lp::engine_stats> snap_stats;
    snapshot<json>             snap_views;
    uint64_t                     n_submitted = 0;  // under mtx_submit
    std::shared_ptr<engine_notifier> notifier;     // made by notify_fd()
    std::shared_ptr<engine_waker>    waker = std::make_shared<engine_waker>();  // what a request's cancel wakes
    int                          notify_read_fd = -1;
    std::atomic<bool>            in_step{false}; // a second thread stepping at once is an error, not a wait
    std::mutex                   mtx_requests;
    std::mutex                   mtx_submit;
    std::vector<running_request> threads;
    std::atomic<uint64_t>        n_finished{0};
    uint64_t                     n_finished_seen = 0;
    bool                         looping = false;
    std::atomic<bool>            closed{false};

    static void init_process() {
        static std::once_flag once;
        std::call_once(once, []() {
            std::setlocale(LC_NUMERIC, "C");
            common_init();
            llama_backend_init();
        });
    }

    // under mtx_step: the stats (or the views) now, for the calls made while a step runs
    void publish(snapshot<lp::engine_stats> & snap) { store(snap, ctx->preempt_stats()); }
    void publish(snapshot<json> & snap) { store(snap, ctx->upstream_views()); }

    template <typename T> static void store(snapshot<T> & snap, T && fresh) {
        std::lock_guard<std::mutex> lk(snap.mtx);
        snap.data = std::move(fresh);
        snap.t_us = now_us();
    }

    template <typename T> T read_snapshot(snapshot<T> & snap, bool & while_stepping, double & age_ms) {
        check_open();
        py::gil_scoped_release nogil;
        std::unique_lock<std::mutex> lk(mtx_step, std::try_to_lock);
        if (lk.owns_lock()) {
            if (!ctx) {  // closed after the check above
                throw engine_closed_error("the Engine is closed: create a new one");
            }
            publish(snap);  // between steps: the slots are not moving
        } else {
            snap.wanted = true;
        }
        std::lock_guard<std::mutex> lk_snap(snap.mtx);
        while_stepping = !lk.owns_lock();  // answered without waiting for the step that runs
        age_ms         = (double) (now_us() - snap.t_us.load()) / 1000.0;
        return snap.data;
    }

    static int64_t now_us() {
        return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }

    void check_open() const {
        if (closed) {
            throw engine_closed_error("the Engine is closed: create a new one");
        }
    }

    // the routes tools/server/server.cpp registers for a single-model server, read from it at build
    // time (cmake/engine-routes.cmake), each wrapped in upstream's own exception wrapper
    void build_route_table() {
        struct route {
            const char * method;
            const char * path;
            server_http_context::handler_t server_routes::*handler;
        };
        static const route routes_of_upstream[] = {
#include "engine-routes.inc"
        };
        for (const auto & r : routes_of_upstream) {
            table.emplace(std::string(r.method) + " " + r.path, ex_wrapper((*routes).*r.handler));
        }
    }

    const server_http_context::handler_t * find_route(const std::string & method, const std::string & path,
                                                      std::map<std::string, std::string> & params_kv) const {
        auto it = table.find(method + " " + path);
        if (it != table.end()) {
            return &it->second;
        }
        const std::string slots_prefix = "/slots/";
        if (method == "POST" && path.rfind(slots_prefix, 0) == 0 && path.size() > slots_prefix.size()) {
            params_kv["id_slot"] = path.substr(slots_prefix.size());
            return &table.at("POST /slots/:id_slot");
        }
        return nullptr;
    }

    void run_request(engine_request & r, const server_http_context::handler_t & handler, const std::string & method,
                     const std::string & path, const std::string & query,
                     const std::map<std::string, std::string> & params_kv, const std::string & body) {
        {
            server_http_req req{ params_kv, {}, path, query, body, {}, r.should_stop };
            server_http_res_ptr res = handler ? handler(req) : not_found(method, path);
            if (res->is_stream()) {
                r.set_started(res->status, true, "");
                while (true) {
                    std::string chunk;
                    bool more = false;
                    try {
                        more = res->next(chunk);
                    } catch (const std::exception & e) {
                        chunk = "error: " + safe_json_to_str(format_error_response(e.what(), ERROR_TYPE_SERVER)) + "\n\n";
                    }
                    if (!chunk.empty()) {
                        r.push_chunk(std::move(chunk));
                    }
                    if (!more) {
                        break;
                    }
                }
            } else {
                r.set_started(res->status, false, res->data);
            }
            res->on_complete();
            res.reset();  // before req: the response keeps a pointer to it
        }
        r.set_done();
        n_finished++;
    }

    // join the threads of finished requests (their Python handles keep the results)
    void reap_finished() {
        for (auto it = threads.begin(); it != threads.end();) {
            bool done;
            {
                std::lock_guard<std::mutex> lk(it->req->mtx);
                done = it->req->done;
            }
            if (done) {
                it->thread.join();
                it = threads.erase(it);
            } else {
                ++it;
            }
        }
    }
};

} // namespace

void register_request(py::module_ & m);

void register_engine(py::module_ & m) {
    static py::exception<engine_error> exc_engine(m, "EngineError", PyExc_RuntimeError);
    static py::exception<engine_closed_error> exc_closed(m, "EngineClosedError", exc_engine.ptr());
    static py::exception<engine_busy_error> exc_busy(m, "EngineBusyError", exc_engine.ptr());
    static py::exception<model_load_error> exc_load(m, "ModelLoadError", exc_engine.ptr());
    static py::exception<engine_argument_error> exc_args(m, "EngineArgumentError", PyExc_ValueError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const engine_closed_error & e) {
            py::set_error(exc_closed, e.what());
        } catch (const engine_busy_error & e) {
            py::set_error(exc_busy, e.what());
        } catch (const model_load_error & e) {
            py::set_error(exc_load, e.what());
        } catch (const engine_error & e) {
            py::set_error(exc_engine, e.what());
        } catch (const engine_argument_error & e) {
            py::set_error(exc_args, e.what());
        }
    });

    register_request(m);  // py-engine-request.cpp: the handle of one request

    py::class_<engine>(m, "EngineCore", "the patched llama-server in process; Python drives its loop")
        .def(py::init<const std::vector<std::string> &>(), py::arg("args"),
             "load a model with llama-server's own argument parser (argv without the program name)")
        .def("submit", &engine::submit, py::arg("method"), py::arg("path"), py::arg("body") = "",
             py::arg("wait_queued") = true,
             "start a request on an upstream route handler (its own thread); with wait_queued, return once its "
             "task is queued; returns its handle")
        .def("step", &engine::step, "one iteration of the server loop; what happened in it (a StepReportCore)")
        .def("wait", &engine::wait, py::arg("timeout_s"),
             "wait (GIL released) until a task is queued or a request finished; True if either happened")
        .def("stats", &engine::stats, "preemption counters and gauges (every series of metric_names()), the labeled "
             "counters and the slots (the fields /slots shows), as an EngineStatsCore, as of the last step boundary (never "
             "waits for a step); age_ms: how old")
        .def("views", &engine::views, "upstream's /slots entries and /metrics text as of the last step boundary "
             "(never waits for a step): {'slots', 'metrics_text', 'age_ms', 'while_stepping'}")
        .def("notify_fd", &engine::notify_fd, "the read end of a pipe carrying the ids (uint64, native order) of "
             "requests with news, for an event loop to watch; made once, closed with the Engine")
        .def("take_missed", &engine::take_missed, "whether the pipe lost news since the last call (look at every request)")
        .def("n_pending", &engine::n_pending, "requests whose handler has not finished")
        .def("n_queued", &engine::n_queued, "tasks queued for the loop's next step")
        .def("model_info", [](const engine & e) { return model_info(e.lctx()); }, "n_ctx, n_vocab, token_bos, metadata, ...")
        .def("tokenize", [](const engine & e, const std::string & text, bool add_special, bool parse_special) {
            return tokenize(e.lctx(), text, add_special, parse_special); }, "the model's tokens of these bytes")
        .def("detokenize", [](const engine & e, const std::vector<int32_t> & tokens, bool special) {
            return detokenize(e.lctx(), tokens, special); }, "the bytes of these tokens' pieces")
        .def("request_fields", &engine::fields, "the request fields of this server's schema (see _core.request_fields)")
        .def_property_readonly("closed", &engine::is_closed)
        .def("close", &engine::close, "cancel pending requests, stop the loop and free the model and context");
}
