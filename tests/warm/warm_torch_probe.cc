// ctrun_warm_torch_probe: a LibTorch worker that opts into warm starts (CTRUN_MAIN) and draws
// from LibTorch's default CPU generator before main (in the warm server: the generator is created
// there) and again in main. Writes "<initial seed> <torch::rand>" to
// DIR/attempt<TORCHELASTIC_RESTART_COUNT>-rank<RANK>.txt; with --fail-attempt A, exits 1 in
// attempt A once every one of --ranks N ranks has written its file.
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "ctrun/warm_main.h"

namespace {

const double kBeforeMain = torch::rand({1}).item<double>();

std::string Env(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "0";
}

std::string FileOf(const std::string& dir, const std::string& attempt, const std::string& rank) {
  return dir + "/attempt" + attempt + "-rank" + rank + ".txt";
}

int ProbeMain(int argc, char** argv) {
  if (argc < 2) return 64;
  const std::string dir = argv[1], attempt = Env("TORCHELASTIC_RESTART_COUNT");
  const std::string fail_attempt = argc > 3 ? argv[3] : "-1";
  const int ranks = argc > 2 ? std::atoi(argv[2]) : 1;
  const std::string path = FileOf(dir, attempt, Env("RANK"));
  std::ofstream(path + ".tmp") << at::detail::getDefaultCPUGenerator().current_seed() << " "
                               << torch::rand({1}).item<double>() << " " << kBeforeMain << "\n";
  std::rename((path + ".tmp").c_str(), path.c_str());
  if (attempt != fail_attempt) return 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int r = 0; r < ranks && std::chrono::steady_clock::now() < deadline;)
    if (::access(FileOf(dir, attempt, std::to_string(r)).c_str(), F_OK) == 0) ++r;
    else std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return 1;
}

}  // namespace

CTRUN_MAIN(ProbeMain)
