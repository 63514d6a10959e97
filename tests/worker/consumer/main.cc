// Uses the installed ctrun::worker: env parsing, error-file JSON, a snapshot round trip, and
// CTRUN_MAIN as its entry point (a plain main without ctrun --warm).
#include <ctrun/warm_main.h>
#include <ctrun/worker.h>

#include <cstdio>

int consumer_main(int argc, char** argv) {
  namespace cw = ctrun::worker;
  if (argc < 2) return 2;
  std::string err;
  auto env = cw::LaunchEnv::parse([](const std::string&) { return std::optional<std::string>(); }, &err);
  if (env || err.find("RANK is not set") == std::string::npos) return 3;
  cw::SnapshotOptions o;
  o.dir = argv[1];
  cw::SnapshotStore store(o);
  store.save(42, std::vector<std::byte>(100, std::byte{7}));
  auto r = store.load_latest();
  if (!r.snapshot || r.snapshot->step != 42 || r.snapshot->data.size() != 100) return 4;
  std::printf("consumer ok: %s", cw::error_file_json("m", "c", 1).c_str());
  return 0;
}

CTRUN_MAIN(consumer_main)
