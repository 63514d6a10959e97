// Reading the Python stack dump a stack capture leaves on a rank's stderr (faulthandler's format,
// written by _Py_DumpTracebackThreads; see stack_capture.h). Pure: text in, answer out.
//
//   Current thread 0x00007f1bc02bb040 (most recent call first):
//     File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 1541 in all_reduce
//     File "/work/train.py", line 20 in <module>
#pragma once

#include <string>
#include <string_view>

namespace ctrun::health {

// The innermost frame of the thread the dump was taken on (the last "Current thread" block of
// `stderr_text`), as `File "PATH", line N in FUNC`; "" when there is no such block.
std::string InnermostFrame(std::string_view stderr_text);

// Whether that frame is inside torch.distributed (a collective or a wait for one: the rank is
// waiting for its peers).
bool WaitsInACollective(std::string_view stderr_text);

}  // namespace ctrun::health
