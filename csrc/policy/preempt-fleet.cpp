// A fleet of independent simulated servers behind a router: what N servers do with one load.
//
// Every server is a sim_server with its own pool, slots and clock; nothing is shared but the
// arrivals. At each arrival every server first runs up to that moment, so the router sees the
// whole fleet as it is then, and the request joins the chosen server's queue.
#include "preempt-sim.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
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
size_t pick_server(const std::vector<sim_server> & servers, sim_route route, size_t k) {
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

    // arrivals in time order (equal times keep the caller's order), results in the caller's order
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return requests[a].t_arrival < requests[b].t_arrival;
    });

    std::vector<sim_server> servers(n_srv, sim_server(p));
    sim_fleet_result out;
    out.server_of.resize(n);
    out.parked_seen.resize(n * n_srv);
    std::vector<size_t> local(n);  // a request's number on its server
    for (size_t k = 0; k < n; ++k) {
        const size_t i = order[k];
        for (auto & s : servers) {
            s.run_until(requests[i].t_arrival);
        }
        for (size_t j = 0; j < n_srv; ++j) {
            out.parked_seen[i * n_srv + j] = servers[j].n_parked();
        }
        const size_t j = pick_server(servers, route, k);
        out.server_of[i] = (int32_t) j;
        local[i] = servers[j].reqs.size();
        servers[j].arrive(requests[i]);
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
        const sim_request_result & r = servers[out.server_of[i]].res.requests[local[i]];
        out.requests[i] = r;
        out.servers[out.server_of[i]].requests.push_back(r);
    }
    return out;
}

} // namespace llama_preempt
