// ctrun/worker.h — the plain C++ worker library in one include (no LibTorch): launcher
// environment, error file, heartbeats, snapshot store. LibTorch helpers: ctrun/torch_dist.h and
// ctrun/torch_snapshot.h (target ctrun::worker_torch).
#pragma once

#include "ctrun/error_file.h"
#include "ctrun/heartbeat.h"
#include "ctrun/launch_env.h"
#include "ctrun/snapshot_store.h"
