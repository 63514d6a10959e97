// ParseShebang and ShebangProgram: the #! line as the kernel splits it, and the program env(1) runs.
#include "base/shebang.h"

#include <gtest/gtest.h>

namespace ctrun {
namespace {

TEST(Shebang, TheKernelsSplitInterpreterAndOneArgument) {
  auto s = ParseShebang("#!/usr/bin/env python3 -u\nimport os\n");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->interpreter, "/usr/bin/env");
  EXPECT_EQ(s->arg, "python3 -u");
  s = ParseShebang("#! \t/usr/bin/python3.11\t \r\nx");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->interpreter, "/usr/bin/python3.11");
  EXPECT_EQ(s->arg, "");
  s = ParseShebang("#!/bin/sh");  // no newline in the head
  ASSERT_TRUE(s);
  EXPECT_EQ(s->interpreter, "/bin/sh");
  EXPECT_FALSE(ParseShebang("import os\n"));
  EXPECT_FALSE(ParseShebang("#!   \n"));
  EXPECT_FALSE(ParseShebang(""));
}

TEST(Shebang, TheProgramIsWhatEnvLooksUp) {
  EXPECT_EQ(ShebangProgram(*ParseShebang("#!/usr/bin/env python3\n")), "python3");
  EXPECT_EQ(ShebangProgram(*ParseShebang("#!/usr/bin/env -S OMP_NUM_THREADS=1 python3 -u\n")), "python3");
  EXPECT_EQ(ShebangProgram(*ParseShebang("#!/usr/bin/python3 -u\n")), "/usr/bin/python3");
  EXPECT_EQ(ShebangProgram(*ParseShebang("#!/usr/bin/env\n")), "/usr/bin/env");
}

TEST(IsPythonProgram, PythonAndItsVersionedNamesOnly) {
  for (const char* yes : {"python", "python3", "python3.11", "/usr/bin/python3.11", "./venv/bin/python"})
    EXPECT_TRUE(IsPythonProgram(yes)) << yes;
  for (const char* no : {"", "/usr/bin/env", "pythonista", "python3-config", "/opt/python3/bin/train", "ipython"})
    EXPECT_FALSE(IsPythonProgram(no)) << no;
}

}  // namespace
}  // namespace ctrun
