#include "tests/integration/worker_runner.h"

#include <sys/wait.h>

#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"

namespace kvcache::testing {

absl::StatusOr<WorkerRunner> WorkerRunner::Create(std::string bin_dir, std::string checkpoint,
                                                  uint32_t block_size, uint32_t new_tokens) {
  absl::StatusOr<worker::WorkerModel> model = worker::WorkerModel::Load(checkpoint);
  if (!model.ok()) return model.status();
  return WorkerRunner(std::move(bin_dir), std::move(checkpoint), block_size, new_tokens,
                      *std::move(model));
}

std::vector<std::string> WorkerRunner::Argv(const std::string& target, const std::string& pool,
                                            const std::vector<uint32_t>& prompt) const {
  return {bin_dir_ + "/kvcache-worker",
          "--target=" + target,
          "--pool=" + pool,
          "--checkpoint=" + checkpoint_,
          "--tokens=" + absl::StrJoin(prompt, ","),
          "--max_new_tokens=" + std::to_string(new_tokens_)};
}

ClientResult WorkerRunner::Prefill(const std::string& target, const std::string& pool,
                                   const std::vector<uint32_t>& prompt,
                                   const std::string& decode_target, const std::string& transport,
                                   absl::Duration bound) const {
  std::vector<std::string> argv = Argv(target, pool, prompt);
  argv.insert(argv.end(),
              {"--role=prefill", "--decode_target=" + decode_target, "--transport=" + transport});
  return Run(argv, bound);
}

WorkerTurn WorkerRunner::RunTurn(const std::vector<std::string>& argv, absl::Duration bound,
                                 bool read_turn_line) {
  WorkerTurn run;
  absl::StatusOr<Subprocess> worker = Subprocess::Start(argv);
  EXPECT_OK(worker);
  if (!worker.ok()) return run;
  if (read_turn_line) {
    absl::StatusOr<std::string> turn = worker->ReadLineStartingWith("turn 1:", bound);
    EXPECT_OK(turn);
    if (turn.ok()) run.turn_line = *turn;
  }
  absl::StatusOr<std::string> line = worker->ReadLineStartingWith("result ", bound);
  EXPECT_OK(line);
  if (line.ok()) {
    std::optional<ClientResult> parsed = ParseResult(*line);
    EXPECT_TRUE(parsed.has_value()) << "unparsable: " << *line;
    if (parsed.has_value()) run.result = *std::move(parsed);
  }
  absl::StatusOr<int> status = worker->Wait(bound);
  EXPECT_OK(status);
  if (status.ok()) {
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << "kvcache-worker " << DescribeWaitStatus(*status);
  }
  return run;
}

std::vector<ClientResult> WorkerRunner::RunTurns(const std::vector<std::string>& argv, int turns,
                                                 absl::Duration bound) {
  std::vector<ClientResult> results;
  absl::StatusOr<Subprocess> worker = Subprocess::Start(argv);
  EXPECT_OK(worker);
  if (!worker.ok()) return results;
  for (int turn = 1; turn <= turns; ++turn) {
    absl::StatusOr<std::string> line = worker->ReadLineStartingWith("result ", bound);
    EXPECT_OK(line) << "turn " << turn;
    if (!line.ok()) break;
    std::optional<ClientResult> parsed = ParseResult(*line);
    EXPECT_TRUE(parsed.has_value()) << "unparsable: " << *line;
    results.push_back(parsed.value_or(ClientResult{}));
  }
  absl::StatusOr<int> status = worker->Wait(bound);
  EXPECT_OK(status);
  if (status.ok()) {
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << "kvcache-worker " << DescribeWaitStatus(*status);
  }
  results.resize(turns);  // a failed test still indexes every turn
  return results;
}

void WorkerRunner::ExpectMatchesCold(const ClientResult& result,
                                     const std::vector<uint32_t>& prompt) const {
  worker::Sampler sampler = worker::Sampler::Greedy();
  absl::StatusOr<worker::GenerationResult> cold =
      model_.GenerateCold(prompt, new_tokens_, sampler, block_size_, DType::kBFloat16);
  ASSERT_OK(cold);
  EXPECT_EQ(result.Field("tokens"), absl::StrJoin(cold->tokens, ","));
  EXPECT_EQ(result.Field("digest"), absl::StrFormat("%016x", cold->logits_digest));
}

}  // namespace kvcache::testing
