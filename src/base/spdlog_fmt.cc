// spdlog's and fmt's compiled parts, built into ctrun from the headers of libspdlog-dev and
// libfmt-dev, so that ctrun loads neither libspdlog.so nor libfmt.so at run time.
//
// Every other translation unit uses the two libraries as compiled libraries (SPDLOG_COMPILED_LIB,
// no FMT_HEADER_ONLY): their headers declare, and this file alone defines. Header-only use would
// compile the same definitions into each of the ~15 files that log (measured: +6.5 to +10.7 s of
// CPU each, +27% CPU for a clean build of ctrun). What is instantiated here is what ctrun and its
// tests use; a use of something else fails at link time, never at run time.
#ifndef SPDLOG_COMPILED_LIB
#error "spdlog_fmt.cc is the compiled part of spdlog; build it with SPDLOG_COMPILED_LIB"
#endif
#ifdef FMT_HEADER_ONLY
#error "spdlog_fmt.cc is the compiled part of fmt; build it without FMT_HEADER_ONLY"
#endif

#include <fmt/format-inl.h>
#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/spdlog-inl.h>

#include <mutex>

// fmt: what format.h declares `extern template` when it is not header-only.
FMT_BEGIN_NAMESPACE
namespace detail {
template FMT_API auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
}  // namespace detail
FMT_END_NAMESPACE

// spdlog: the sink base of ctrun's DiagnosticSink, and the colour sink of the registry's default
// logger (stdout), which exists until ctrun installs its own.
template class spdlog::sinks::base_sink<std::mutex>;
template class spdlog::sinks::ansicolor_stdout_sink<spdlog::details::console_mutex>;
