// ReasoningSplitter (reasoning.h).
#include "daemon/chat/reasoning.h"

#include <algorithm>

namespace sx::chat {

namespace {

// The length of the longest suffix of `s` that is a proper prefix of `tag` (bytes that may begin
// it in the next piece).
std::size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (std::size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

std::string_view trim_newlines(std::string_view s, bool front, bool back) {
  while (front && !s.empty() && s.front() == '\n') s.remove_prefix(1);
  while (back && !s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

}  // namespace

bool prompt_opens_thinking(std::string_view prompt) {
  const std::size_t open = prompt.rfind(kThinkOpen);
  if (open == std::string_view::npos) return false;
  const std::size_t close = prompt.rfind(kThinkClose);
  return close == std::string_view::npos || close < open;
}

bool template_thinks(std::string_view template_source) {
  return template_source.find(kThinkClose) != std::string_view::npos;
}

ReasoningSplitter::ReasoningSplitter(bool prompt_opened_thinking)
    : state_(prompt_opened_thinking ? State::kReasoning : State::kStart),
      reasoned_(prompt_opened_thinking),
      after_open_(prompt_opened_thinking) {}

ReasoningSplitter::Parts ReasoningSplitter::feed(std::string_view piece) {
  Parts out;
  held_.append(piece);
  for (;;) {
    if (state_ == State::kStart) {
      // Leading whitespace, then maybe <think>.
      const std::size_t first = held_.find_first_not_of(" \t\r\n");
      if (first == std::string::npos) return out;  // only whitespace so far: undecided
      const std::string_view rest = std::string_view(held_).substr(first);
      if (rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest) return out;  // "<thi"
      if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
        held_.erase(0, first + kThinkOpen.size());
        state_ = State::kReasoning;
        reasoned_ = true;
        after_open_ = true;
        continue;
      }
      state_ = State::kContent;
      continue;
    }
    if (state_ == State::kReasoning) {
      if (after_open_) {
        if (held_.empty()) return out;
        if (held_.front() == '\n') held_.erase(0, 1);
        after_open_ = false;
      }
      const std::size_t close = held_.find(kThinkClose);
      if (close == std::string::npos) {
        const std::size_t keep = partial_tag_suffix(held_, kThinkClose);
        out.reasoning.append(held_, 0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return out;
      }
      out.reasoning.append(held_, 0, close);
      held_.erase(0, close + kThinkClose.size());
      // The newlines that follow </think> open no content.
      const std::size_t text = held_.find_first_not_of('\n');
      if (text == std::string::npos) {
        held_.clear();
        state_ = State::kContent;
        after_open_ = true;  // reused: newlines still to skip at the content's start
        return out;
      }
      held_.erase(0, text);
      state_ = State::kContent;
      continue;
    }
    // Content.
    if (after_open_) {
      const std::size_t text = held_.find_first_not_of('\n');
      if (text == std::string::npos) {
        held_.clear();
        return out;
      }
      held_.erase(0, text);
      after_open_ = false;
    }
    out.content.append(held_);
    held_.clear();
    return out;
  }
}

ReasoningSplitter::Parts ReasoningSplitter::finish() {
  Parts out;
  if (state_ == State::kReasoning) {
    out.reasoning = std::move(held_);
  } else if (state_ == State::kStart) {
    out.content = std::move(held_);  // whitespace only, or a lone "<thi"
  }
  held_.clear();
  return out;
}

ReasoningSplitter::Whole ReasoningSplitter::split(std::string_view answer, bool prompt_opened_thinking) {
  ReasoningSplitter s(prompt_opened_thinking);
  Parts all = s.feed(answer);
  Parts rest = s.finish();
  Whole whole;
  whole.content = std::move(all.content) + rest.content;
  if (s.reasoned()) whole.reasoning = std::string(trim_newlines(all.reasoning + rest.reasoning, true, true));
  return whole;
}

}  // namespace sx::chat
