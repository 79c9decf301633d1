// Thinking split out of an answer (issue 41 item 3): Qwen3 and later write
// "<think>\nREASONING\n</think>\n\nCONTENT", or only "REASONING\n</think>\n\nCONTENT" when the chat
// template already opened <think> in the prompt (Qwen3.5 / 3.6, Qwen3-Thinking-2507). Clients take
// the reasoning as `reasoning_content` beside `content`, in whole answers and in stream deltas.
//
// ReasoningSplitter takes the answer as it arrives, in pieces cut anywhere (a tag may straddle two
// pieces: the undecided bytes wait for the next piece), and says what can be told now. Reasoning
// starts at the beginning (prompt already in thinking) or with a <think> the answer opens with; it
// ends at the first </think>; everything after it is content. An answer that never closes its
// thinking is all reasoning. Pure; one per choice; not thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sx::chat {

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

// Whether a rendered prompt leaves the model thinking: a <think> after the last </think>.
bool prompt_opens_thinking(std::string_view prompt);
// Whether a chat template produces thinking (it names </think>): such a model's answers are split.
bool template_thinks(std::string_view template_source);

class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool prompt_opened_thinking);
  struct Parts {
    std::string reasoning, content;
  };
  // What of `piece` (and of what was held back) can be told now.
  Parts feed(std::string_view piece);
  // The end of the answer: what was held back.
  Parts finish();
  // Whether any reasoning was seen (a <think>, or the prompt's).
  bool reasoned() const { return reasoned_; }

  // A whole answer at once, as transformers-side parsers give it: reasoning without the newlines
  // around it (null when the answer has none: reasoned() false), content without the newlines that
  // open it.
  struct Whole {
    std::optional<std::string> reasoning;
    std::string content;
  };
  static Whole split(std::string_view answer, bool prompt_opened_thinking);

 private:
  enum class State { kStart, kReasoning, kContent };
  State state_;
  bool reasoned_ = false;
  bool after_open_ = false;  // just past <think>: its newline is not reasoning
  std::string held_;
};

}  // namespace sx::chat
