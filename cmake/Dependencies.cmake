# All dependencies are Debian packages (scripts/debian-packages.txt); nothing is downloaded.
find_package(Threads REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(fmt CONFIG REQUIRED)
# spdlog and fmt without their shared libraries, so that ctrun needs only glibc at run time: ctrun's
# files compile against the headers exactly as against Debian's compiled spdlog::spdlog and fmt::fmt
# (the same definitions; SPDLOG_SHARED_LIB and FMT_SHARED only mark symbols visibility("default")
# on ELF, which they are anyway), and src/base/spdlog_fmt.cc compiles the two libraries' code once
# into ctrun_sys. ctrun_spdlog is that interface: headers and definitions, no library.
set(ctrun_spdlog_defs)
foreach(lib spdlog::spdlog fmt::fmt)
  get_target_property(defs ${lib} INTERFACE_COMPILE_DEFINITIONS)
  list(APPEND ctrun_spdlog_defs ${defs})
endforeach()
if(NOT "SPDLOG_COMPILED_LIB" IN_LIST ctrun_spdlog_defs OR NOT "SPDLOG_FMT_EXTERNAL" IN_LIST ctrun_spdlog_defs)
  message(FATAL_ERROR "spdlog::spdlog is not a compiled spdlog with an external fmt: ${ctrun_spdlog_defs}")
endif()
get_target_property(ctrun_spdlog_includes spdlog::spdlog INTERFACE_INCLUDE_DIRECTORIES)
add_library(ctrun_spdlog INTERFACE)
target_compile_definitions(ctrun_spdlog INTERFACE ${ctrun_spdlog_defs})
target_include_directories(ctrun_spdlog SYSTEM INTERFACE ${ctrun_spdlog_includes})
target_link_libraries(ctrun_spdlog INTERFACE Threads::Threads)
find_package(nlohmann_json 3 CONFIG REQUIRED)
# libcurl (multi interface on the agent's event loop) for the etcd v3 rendezvous backend.
find_package(CURL REQUIRED)
if(CTRUN_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
if(CTRUN_BUILD_BENCH)
  find_package(benchmark CONFIG QUIET)
endif()

# LibTorch 1.13 (Debian libtorch-dev, CPU, gloo). Optional: only the worker library's torch part and
# the examples use it. The agent never links it.
set(CTRUN_HAVE_TORCH OFF)
if(CTRUN_WITH_TORCH)
  find_package(Torch CONFIG QUIET)
  if(Torch_FOUND)
    set(CTRUN_HAVE_TORCH ON)
    message(STATUS "ctrun: LibTorch ${Torch_VERSION} found")
  else()
    message(STATUS "ctrun: LibTorch not found; torch helpers and examples skipped")
  endif()
endif()

# CUDA + NCCL under /usr/local/cuda, for the nccl_allreduce example only (compile + link in CI).
set(CTRUN_HAVE_NCCL OFF)
find_program(CTRUN_NVCC nvcc PATHS /usr/local/cuda/bin NO_DEFAULT_PATH)
find_path(CTRUN_NCCL_INCLUDE nccl.h PATHS /usr/local/cuda/include NO_DEFAULT_PATH)
find_library(CTRUN_NCCL_LIB nccl PATHS /usr/local/cuda/lib64 NO_DEFAULT_PATH)
find_library(CTRUN_CUDART_LIB cudart PATHS /usr/local/cuda/lib64 NO_DEFAULT_PATH)
if(CTRUN_NVCC AND CTRUN_NCCL_INCLUDE AND CTRUN_NCCL_LIB AND CTRUN_CUDART_LIB)
  set(CTRUN_HAVE_NCCL ON)
  message(STATUS "ctrun: CUDA+NCCL found (${CTRUN_NCCL_LIB})")
endif()

find_package(PkgConfig QUIET)
find_library(CTRUN_ZSTD_LIB zstd)
find_path(CTRUN_ZSTD_INCLUDE zstd.h)
