// A fleet of identical, independent simulated servers behind a router (preempt-fleet.cpp).
#pragma once

#include "preempt-sim.h"

#include <string>
#include <vector>

namespace llama_preempt {

// one server: simulate_fleet() with a fleet of one
sim_result simulate(const std::vector<sim_request> & requests, const sim_params & p);

// --- a fleet of identical, independent servers behind a router ---

enum class sim_route : int32_t {
    round_robin,   // the i-th arrival goes to server i % n
    least_parked,  // to the server with the fewest requests parked; ties: fewest busy + queued, then lowest index
};

const char * sim_route_name(sim_route r);  // round-robin, least-parked (the CLI's spelling)
bool parse_sim_route(const std::string & s, sim_route & out);

struct sim_fleet_result {
    std::vector<sim_result> servers;   // each with its own requests, in the caller's order among them
    std::vector<int32_t>    server_of; // per request (the caller's order): the server it went to
    std::vector<sim_request_result> requests;  // every request's result, in the caller's order
    // per request (the caller's order), n_servers values: each server's parked requests when the
    // router placed it, as the router saw them
    std::vector<int32_t>    parked_seen;
};

sim_fleet_result simulate_fleet(const std::vector<sim_request> & requests, const sim_params & p,
                                int32_t n_servers, sim_route route);

} // namespace llama_preempt
