// Stop strings over streamed text: holds back text that may be the start of a stop string, and
// reports when one has appeared (the text up to it is released; the stop string is not).
// Threading: one per request.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sx::engine {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds decoded text; returns the text that is safe to emit now. After a stop string is found,
  // stopped() is true and everything from the stop string on is dropped.
  std::string push(std::string_view text);
  // Returns the held-back remainder (at the end of generation).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace sx::engine
