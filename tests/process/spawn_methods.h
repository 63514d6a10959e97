// The ways PosixSpawner makes children, for tests that run once per way (INSTANTIATE_TEST_SUITE_P).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "process/spawner.h"

namespace ctrun {

inline auto SpawnMethods() {
  return ::testing::Values(PosixSpawner::Method::kVfork, PosixSpawner::Method::kFork);
}

inline std::string SpawnMethodName(const ::testing::TestParamInfo<PosixSpawner::Method>& p) {
  return p.param == PosixSpawner::Method::kFork ? "Fork" : "Vfork";
}

}  // namespace ctrun
