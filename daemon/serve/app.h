// The `sextant serve` daemon: one libuv loop serving the OpenAI API over HTTP and the admin API
// over a Unix socket, an engine thread, and a loader thread for start-up (DESIGN.md §3, §7.5).
//
// Start-up phases, each logged: config -> http (listen) -> admin (socket) -> model check (file,
// tokenizer) -> devices -> plan -> load -> warm-up -> ready. HTTP listens from the start so that
// /health answers 503 while the model loads; /v1 requests get 503 until ready. When a phase fails
// the daemon logs one summary line "serve: failed in phase <phase>: <first error>" and exits 1.
//
// Shutdown: SIGTERM or the admin `shutdown` command drain (no new requests: 503; in-flight requests
// finish), then close every handle and exit 0. A second SIGINT exits at once (status 130).
//
// Threading: run() owns the loop thread; the engine and loader threads reach it only through
// loop::AsyncQueue (DESIGN.md §7.5).
#pragma once

#include <string>
#include <vector>

#include "daemon/config/serve_config.h"

namespace sx::daemon::serve {

// Runs the daemon until it shuts down; returns the process exit status. `serve_args` are the
// arguments after `serve` that gave `config`: a reload (ctl reload, SIGHUP) reads them again.
int run_daemon(const config::ServeConfig& config, std::vector<std::string> serve_args);

}  // namespace sx::daemon::serve
