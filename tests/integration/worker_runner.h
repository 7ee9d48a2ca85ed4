// kvcache-worker processes for the integration tests, and the cold run their tokens and logits
// must equal bit for bit: the checkpoint's cold run over a private pool in this process (greedy,
// the CPU model, Qwen3-MoE or the hybrid, bf16 KV), the reference every cached run — a prefix hit,
// a block loaded from a lower tier or another node — is checked against.
//
// Thread safety: thread-compatible.
#ifndef KVCACHE_TESTS_INTEGRATION_WORKER_RUNNER_H_
#define KVCACHE_TESTS_INTEGRATION_WORKER_RUNNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/integration/daemon_process_fixture.h"
#include "worker/generation.h"
#include "worker/worker_model.h"

namespace kvcache::testing {

// What a worker process printed for its first turn.
struct WorkerTurn {
  ClientResult result;
  std::string turn_line;  // "turn 1: ... cold check: ..."; empty when not read
};

class WorkerRunner {
 public:
  // Loads the checkpoint (for the cold runs); NOT_FOUND without one.
  static absl::StatusOr<WorkerRunner> Create(std::string bin_dir, std::string checkpoint,
                                             uint32_t block_size, uint32_t new_tokens);

  // kvcache-worker's command line generating from `prompt` over `target`'s pool `pool`; a test
  // appends its own flags (a role, a token file).
  std::vector<std::string> Argv(const std::string& target, const std::string& pool,
                                const std::vector<uint32_t>& prompt) const;
  // The prefill role on `target`'s pool `pool`: computes `prompt` and ships its full blocks to
  // `decode_target`'s pool of the same name over `transport` (stream, shm or nccl); its result
  // line, as Run.
  ClientResult Prefill(const std::string& target, const std::string& pool,
                       const std::vector<uint32_t>& prompt, const std::string& decode_target,
                       const std::string& transport, absl::Duration bound) const;
  // Runs `argv` to its end: its (first) result line. A missing line, or an exit status other
  // than 0 within `bound`, fails the test.
  ClientResult Run(const std::vector<std::string>& argv, absl::Duration bound) const {
    return RunTurn(argv, bound, /*read_turn_line=*/false).result;
  }
  // Run, also reading its "turn 1:" line first when `read_turn_line` (the prefill role prints
  // none).
  static WorkerTurn RunTurn(const std::vector<std::string>& argv, absl::Duration bound,
                            bool read_turn_line);
  // Runs `argv` (a worker with --turns=`turns`) to its end: the result line of each turn. A
  // missing line, or an exit status other than 0 within `bound` (with --check_cold: a turn that
  // differed from its cold run), fails the test.
  static std::vector<ClientResult> RunTurns(const std::vector<std::string>& argv, int turns,
                                            absl::Duration bound);
  // Expects `result`'s tokens and logits digest to be those of a cold run of `prompt`.
  void ExpectMatchesCold(const ClientResult& result, const std::vector<uint32_t>& prompt) const;

  const worker::WorkerModel& model() const { return model_; }

 private:
  WorkerRunner(std::string bin_dir, std::string checkpoint, uint32_t block_size,
               uint32_t new_tokens, worker::WorkerModel model)
      : bin_dir_(std::move(bin_dir)),
        checkpoint_(std::move(checkpoint)),
        block_size_(block_size),
        new_tokens_(new_tokens),
        model_(std::move(model)) {}

  std::string bin_dir_;
  std::string checkpoint_;
  uint32_t block_size_;
  uint32_t new_tokens_;
  worker::WorkerModel model_;
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_INTEGRATION_WORKER_RUNNER_H_
