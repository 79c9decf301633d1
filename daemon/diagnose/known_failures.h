// The catalogue of known failures (issue 22 item 5): the errors that end a start or a request on
// the seed's machines, each recognised from the error Sextant reports (its code and the words its
// producer puts in it) and answered with its root cause and fix on one line, e.g.
//   cause: another process listens on the HTTP port; fix: stop it (ss -ltnp names it) or choose --port
// Printed after the error by a failed `sextant serve` start and by the other commands, logged with
// the first error of a start (start_log.h), and checked by `sextant doctor`.
//
// Threading: pure functions over a constant table.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"

namespace sx::daemon::diagnose {

struct KnownFailure {
  std::string_view id;     // "kv-oom", "collective-timeout", ...
  std::string_view cause;  // one clause
  std::string_view fix;    // one clause
};

// Every entry, in matching order.
const std::vector<KnownFailure>& known_failures();
// The entry `error` matches; nullopt for OK or an error the catalogue does not know.
std::optional<KnownFailure> diagnose(const Status& error);
// "cause: ...; fix: ..." for `error`; empty when diagnose() knows nothing.
std::string cause_and_fix(const Status& error);

}  // namespace sx::daemon::diagnose
