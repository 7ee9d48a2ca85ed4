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

class WorkerRunner {
 public:
  // Loads the checkpoint (for the cold runs); NOT_FOUND without one.
  static absl::StatusOr<WorkerRunner> Create(std::string bin_dir, std::string checkpoint,
                                             uint32_t block_size, uint32_t new_tokens);

  // kvcache-worker's command line generating from `prompt` over `target`'s pool `pool`; a test
  // appends its own flags (a role, a token file).
  std::vector<std::string> Argv(const std::string& target, const std::string& pool,
                                const std::vector<uint32_t>& prompt) const;
  // Runs `argv` to its end: its (first) result line. A missing line, or an exit status other
  // than 0 within `bound`, fails the test.
  ClientResult Run(const std::vector<std::string>& argv, absl::Duration bound) const;
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
