// kvcachectl's shell completion: `source <(kvcachectl completion bash)` (or the script saved in
// /etc/bash_completion.d). Generated from the command table and the flags, so it cannot fall
// behind them: commands, each command's flags and the global ones, the values of -o/--output,
// files for the flags that name files, and --pool's values asked of the daemon the line already
// names (its --target), one second at most.
#ifndef KVCACHE_CTL_COMPLETION_H_
#define KVCACHE_CTL_COMPLETION_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ctl/commands.h"

namespace kvcache::ctl {

struct CompletionFlag {
  std::string name;  // without "--"
  enum class Value { kNone, kWord, kFile } value = Value::kNone;
};

// The bash script: defines _kvcachectl and registers it for "kvcachectl". `commands` are the
// daemon commands; help, completion and version are added. Flag names and words are
// identifiers (letters, digits, '_', '-'), as kvcachectl's are.
std::string BashCompletionScript(absl::Span<const CommandSpec> commands,
                                 absl::Span<const CompletionFlag> global_flags,
                                 absl::Span<const CompletionFlag> command_flags);

}  // namespace kvcache::ctl

#endif  // KVCACHE_CTL_COMPLETION_H_
