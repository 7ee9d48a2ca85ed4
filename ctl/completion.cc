#include "ctl/completion.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvcache::ctl {
namespace {

std::string Flags(absl::Span<const CompletionFlag> flags, CompletionFlag::Value value,
                  bool any_value) {
  std::vector<std::string> names;
  for (const CompletionFlag& flag : flags) {
    if (any_value ? flag.value != CompletionFlag::Value::kNone : flag.value == value) {
      names.push_back(absl::StrCat("--", flag.name));
    }
  }
  return absl::StrJoin(names, " ");
}

}  // namespace

std::string BashCompletionScript(absl::Span<const CommandSpec> commands,
                                 absl::Span<const CompletionFlag> global_flags,
                                 absl::Span<const CompletionFlag> command_flags) {
  std::vector<CompletionFlag> all(global_flags.begin(), global_flags.end());
  all.insert(all.end(), command_flags.begin(), command_flags.end());
  std::vector<std::string> names;
  std::string per_command;
  for (const CommandSpec& spec : commands) {
    names.emplace_back(spec.name);
    std::vector<std::string> flags;
    for (absl::string_view flag : spec.flags) flags.push_back(absl::StrCat("--", flag));
    absl::StrAppend(&per_command, "    ", spec.name, ") flags=\"", absl::StrJoin(flags, " "),
                    "\" ;;\n");
  }
  names.insert(names.end(), {"help", "completion", "version"});
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::vector<std::string> global;
  for (const CompletionFlag& flag : global_flags) global.push_back(absl::StrCat("--", flag.name));
  // The line is split at spaces here, not read from COMP_WORDS, which COMP_WORDBREAKS also
  // splits at '=' and ':' (--target=unix:///x is five words there); only the word being
  // completed is bash's own, since bash replaces just that. A flag's value is completed after
  // a space (-o json), not after '='.
  return absl::StrCat(
      "# bash completion for kvcachectl: source <(kvcachectl completion bash)\n"
      "_kvcachectl() {\n"
      "  local commands=\"",
      absl::StrJoin(names, " "),
      "\"\n"
      "  local global_flags=\"",
      absl::StrJoin(global, " "),
      "\"\n"
      "  local value_flags=\" -o ",
      Flags(all, CompletionFlag::Value::kNone, /*any_value=*/true),
      " \"\n"
      "  local file_flags=\" ",
      Flags(all, CompletionFlag::Value::kFile, /*any_value=*/false),
      " \"\n"
      "  local line=${COMP_LINE:0:COMP_POINT} cur=${COMP_WORDS[COMP_CWORD]}\n"
      "  local -a words\n"
      "  read -ra words <<< \"$line\"\n"
      "  [[ -z $line || $line == *[[:space:]] ]] && words+=(\"\")\n"
      "  local n=${#words[@]} prev=\"\" command=\"\" target=() i=1 word\n"
      "  (( n > 1 )) && prev=${words[n-2]}\n"
      "  while (( i < n - 1 )); do\n"
      "    word=${words[i]}\n"
      "    if [[ $word == --target=* ]]; then\n"
      "      target=(--target \"${word#*=}\")\n"
      "    elif [[ $word == -* && $value_flags == *\" $word \"* ]]; then\n"
      "      [[ $word == --target ]] && target=(--target \"${words[i+1]}\")\n"
      "      (( i += 2 )); continue\n"
      "    elif [[ $word != -* && -z $command ]]; then\n"
      "      command=$word\n"
      "    fi\n"
      "    (( i += 1 ))\n"
      "  done\n"
      "  if [[ $value_flags == *\" $prev \"* && ${words[n-1]} != -* ]]; then\n"
      "    if [[ $prev == -o || $prev == --output ]]; then\n"
      "      COMPREPLY=($(compgen -W \"table json yaml\" -- \"$cur\"))\n"
      "    elif [[ $file_flags == *\" $prev \"* ]]; then\n"
      "      COMPREPLY=($(compgen -f -- \"$cur\"))\n"
      "    elif [[ $prev == --pool ]]; then\n"
      "      local pools\n"
      "      pools=$(\"${COMP_WORDS[0]}\" \"${target[@]}\" --timeout=1s pools --no_headers "
      "2>/dev/null | awk '{print $1}')\n"
      "      COMPREPLY=($(compgen -W \"$pools\" -- \"$cur\"))\n"
      "    else\n"
      "      COMPREPLY=()\n"
      "    fi\n"
      "    return 0\n"
      "  fi\n"
      "  local flags=\"\"\n"
      "  case $command in\n"
      "    \"\") if [[ $cur == -* ]]; then\n"
      "          COMPREPLY=($(compgen -W \"$global_flags\" -- \"$cur\"))\n"
      "        else\n"
      "          COMPREPLY=($(compgen -W \"$commands\" -- \"$cur\"))\n"
      "        fi\n"
      "        return 0 ;;\n"
      "    help) COMPREPLY=($(compgen -W \"$commands\" -- \"$cur\")); return 0 ;;\n"
      "    completion) COMPREPLY=($(compgen -W \"bash\" -- \"$cur\")); return 0 ;;\n",
      per_command,
      "  esac\n"
      "  COMPREPLY=($(compgen -W \"$flags $global_flags --help\" -- \"$cur\"))\n"
      "}\n"
      "complete -F _kvcachectl kvcachectl\n");
}

}  // namespace kvcache::ctl
