// StopMatcher implementation.
#include "runtime/engine/stop_matcher.h"

#include <algorithm>

namespace sx::engine {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove_if(stops_.begin(), stops_.end(), [](const std::string& s) { return s.empty(); }),
               stops_.end());
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  // Earliest complete stop string.
  std::size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const std::size_t at = pending_.find(s);
    if (at != std::string::npos && (first == std::string::npos || at < first)) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  std::size_t hold = 0;
  for (const std::string& s : stops_) {
    const std::size_t max_len = std::min(s.size() - 1, pending_.size());
    for (std::size_t len = max_len; len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  pending_.clear();
  return out;
}

}  // namespace sx::engine
