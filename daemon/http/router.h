// Router: exact (method, path) -> handler, with 404 / 405 fallbacks.
//
// The router knows nothing about any API: the OpenAI handlers (and /health, /metrics...) are
// registered by their owners. Matching is on Request::path (the target without its query), exact
// and case-sensitive, and on the method as sent. A HEAD request with no HEAD route uses the GET
// route (the server suppresses the body). A path with routes but none for the method gets 405 with
// an Allow header; an unknown path goes to the not-found handler (default: 404, text/plain).
//
// Threading: build the router before Server::start; the server then only reads it (dispatch runs
// on the loop thread). Handlers run on the loop thread and must not block it.
//
// Errors: add() returns ALREADY_EXISTS for a duplicate route and INVALID_ARGUMENT for an empty
// method, a path not starting with '/' or an empty handler. Exceptions escaping a handler are
// caught by the server (500 if nothing was sent yet) and logged.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "daemon/http/request.h"
#include "daemon/http/responder.h"
#include "runtime/base/status.h"

namespace sx::daemon::http {

using Handler = std::function<void(Request request, ResponderPtr responder)>;

class Router {
 public:
  Status add(std::string method, std::string path, Handler handler);
  Status get(std::string path, Handler handler) { return add("GET", std::move(path), std::move(handler)); }
  Status post(std::string path, Handler handler) { return add("POST", std::move(path), std::move(handler)); }

  // Replaces the default 404 handler (unknown paths).
  void set_not_found(Handler handler);

  enum class Match { kFound, kMethodNotAllowed, kNotFound };
  // Looks up a route; for kMethodNotAllowed `allow` lists the path's methods ("GET, POST").
  Match match(const std::string& method, const std::string& path, const Handler** handler,
              std::string* allow) const;

  // Routes `request` to its handler, or answers 404 / 405.
  void dispatch(Request request, ResponderPtr responder) const;

 private:
  // path -> (method -> handler)
  std::map<std::string, std::map<std::string, Handler>, std::less<>> routes_;
  Handler not_found_;
};

}  // namespace sx::daemon::http
