// Router: exact (method, path) -> handler, with 404 / 405 fallbacks.
#include "daemon/http/router.h"

namespace sx::daemon::http {

Status Router::add(std::string method, std::string path, Handler handler) {
  if (method.empty()) return invalid_argument_error("route {}: empty method", path);
  if (path.empty() || path.front() != '/') {
    return invalid_argument_error("route {} {}: the path must start with '/'", method, path);
  }
  if (!handler) return invalid_argument_error("route {} {}: empty handler", method, path);
  auto& methods = routes_[path];
  if (methods.count(method) != 0) {
    return Status(StatusCode::kAlreadyExists, fmt::format("route {} {} is already registered", method, path));
  }
  methods.emplace(std::move(method), std::move(handler));
  return ok_status();
}

void Router::set_not_found(Handler handler) { not_found_ = std::move(handler); }

Router::Match Router::match(const std::string& method, const std::string& path,
                            const Handler** handler, std::string* allow) const {
  auto it = routes_.find(path);
  if (it == routes_.end()) return Match::kNotFound;
  const auto& methods = it->second;
  auto m = methods.find(method);
  if (m == methods.end() && method == "HEAD") m = methods.find("GET");
  if (m != methods.end()) {
    if (handler) *handler = &m->second;
    return Match::kFound;
  }
  if (allow) {
    allow->clear();
    for (const auto& [name, unused] : methods) {
      if (!allow->empty()) allow->append(", ");
      allow->append(name);
    }
  }
  return Match::kMethodNotAllowed;
}

void Router::dispatch(Request request, ResponderPtr responder) const {
  const Handler* handler = nullptr;
  std::string allow;
  switch (match(request.method, request.path, &handler, &allow)) {
    case Match::kFound:
      (*handler)(std::move(request), std::move(responder));
      return;
    case Match::kMethodNotAllowed:
      responder->respond(405, {{"Content-Type", "text/plain; charset=utf-8"}, {"Allow", allow}},
                         fmt::format("method {} not allowed for {}\n", request.method, request.path));
      return;
    case Match::kNotFound:
      if (not_found_) {
        not_found_(std::move(request), std::move(responder));
      } else {
        responder->respond(404, {{"Content-Type", "text/plain; charset=utf-8"}},
                           fmt::format("no route for {} {}\n", request.method, request.path));
      }
      return;
  }
}

}  // namespace sx::daemon::http
