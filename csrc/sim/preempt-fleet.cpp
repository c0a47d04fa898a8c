// A fleet of independent simulated servers behind a router: what N servers do with one load.
//
// Every server is a sim_server with its own pool, slots and clock; nothing is shared but the
// arrivals. At each arrival every server first runs up to that moment, so the router sees the
// whole fleet as it is then, and the request joins the chosen server's queue.
#include "preempt-fleet.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <set>
#include <utility>

namespace llama_preempt {

const char * sim_route_name(sim_route r) {
    switch (r) {
        case sim_route::round_robin:  return "round-robin";
        case sim_route::least_parked: return "least-parked";
    }
    return "unknown";
}

bool parse_sim_route(const std::string & s, sim_route & out) {
    for (sim_route r : { sim_route::round_robin, sim_route::least_parked }) {
        if (s == sim_route_name(r)) {
            out = r;
            return true;
        }
    }
    return false;
}

namespace {

// the server the k-th arrival (in time order) goes to
size_t pick_server(const std::deque<sim_server> & servers, sim_route route, size_t k) {
    if (route == sim_route::round_robin) {
        return k % servers.size();
    }
    // a server with parked requests is out of room: new work there parks more, or waits behind
    // the restores. Among equals the least loaded, then the lowest index, so a run is reproducible.
    auto key = [](const sim_server & s) { return std::make_pair(s.n_parked(), s.n_busy() + s.n_queued()); };
    size_t best = 0;
    for (size_t j = 1; j < servers.size(); ++j) {
        if (key(servers[j]) < key(servers[best])) {
            best = j;
        }
    }
    return best;
}

} // namespace

sim_fleet_result simulate_fleet(const std::vector<sim_request> & requests, const sim_params & p,
                                int32_t n_servers, sim_route route) {
    const size_t n     = requests.size();
    const size_t n_srv = (size_t) std::max(1, n_servers);

    std::deque<sim_server> servers;  // in place: a server's tiers are views of it
    for (size_t j = 0; j < n_srv; ++j) {
        servers.emplace_back(p);
    }
    sim_fleet_result out;
    out.server_of.assign(n, -1);
    out.parked_seen.resize(n * n_srv);
    std::vector<size_t> local(n);  // a request's number on its server

    // arrivals in time order (equal times keep the caller's order); a turn that follows another is
    // released when that one is done (its pause after it), so a chat's next turn waits for its answer
    std::set<std::pair<double, size_t>> ready;
    std::vector<std::vector<size_t>> followers(n);
    for (size_t i = 0; i < n; ++i) {
        const int32_t a = requests[i].after;
        if (a >= 0 && (size_t) a < i) {
            followers[a].push_back(i);
        } else {
            ready.insert({ requests[i].t_arrival, i });
        }
    }
    std::vector<size_t> watched;  // arrived requests with followers not yet released
    size_t k = 0;  // arrivals so far
    while (true) {
        const double t_next = ready.empty() ? SIM_NEVER : ready.begin()->first;
        if (!watched.empty()) {
            // turns follow others: the server furthest behind moves one step at a time, so a
            // follower is released at its leader's end, before any server runs past it
            sim_server * behind = nullptr;
            for (auto & s : servers) {
                if (!s.stopped && s.t < t_next && s.has_work() && (!behind || s.t < behind->t)) {
                    behind = &s;
                }
            }
            if (behind) {
                const double t0 = behind->t;
                const int64_t n0 = behind->res.n_steps;
                behind->advance(t_next);
                if (behind->t == t0 && behind->res.n_steps == n0 && behind->has_work()) {
                    behind->stopped = true;  // it has work it cannot move (nothing will unblock it)
                }
                for (size_t w = 0; w < watched.size();) {
                    const size_t i = watched[w];
                    const auto & r = servers[out.server_of[i]].res.requests[local[i]];
                    if (r.outcome == sim_outcome::pending) {
                        ++w;
                        continue;
                    }
                    for (size_t f : followers[i]) {
                        ready.insert({ r.t_done + requests[f].t_arrival, f });
                    }
                    watched[w] = watched.back();
                    watched.pop_back();
                }
                continue;
            }
        }
        if (ready.empty()) {
            break;
        }
        const size_t i = ready.begin()->second;
        ready.erase(ready.begin());
        for (auto & s : servers) {
            s.run_until(t_next);
        }
        for (size_t j = 0; j < n_srv; ++j) {
            out.parked_seen[i * n_srv + j] = servers[j].n_parked();
        }
        const size_t j = pick_server(servers, route, k++);
        out.server_of[i] = (int32_t) j;
        local[i] = servers[j].reqs.size();
        sim_request rq = requests[i];
        rq.t_arrival = t_next;
        servers[j].arrive(rq);
        if (!followers[i].empty()) {
            watched.push_back(i);
        }
    }

    out.servers.resize(n_srv);
    for (size_t j = 0; j < n_srv; ++j) {
        servers[j].run_until(SIM_NEVER);
        servers[j].res.makespan_s = servers[j].t;
        out.servers[j] = servers[j].res;
        out.servers[j].requests.clear();
    }
    out.requests.resize(n);
    for (size_t i = 0; i < n; ++i) {
        if (out.server_of[i] < 0) {
            continue;  // never arrived: the turn it follows never ended
        }
        const sim_request_result & r = servers[out.server_of[i]].res.requests[local[i]];
        out.requests[i] = r;
        out.servers[out.server_of[i]].requests.push_back(r);
    }
    return out;
}

sim_result simulate(const std::vector<sim_request> & requests, const sim_params & p) {
    sim_fleet_result fleet = simulate_fleet(requests, p, 1, sim_route::round_robin);
    sim_result r = std::move(fleet.servers[0]);
    r.requests = std::move(fleet.requests);  // every request in the caller's order (one that never arrived: pending)
    return r;
}

} // namespace llama_preempt
