# ctrun_clang_fuzzer(<name> SOURCES <files...> [DEFINES ...] [LIBS ...] [SECONDS s] [LABEL l])
#
# Builds the libFuzzer target <name> from fuzz/<name>.cc plus SOURCES with clang++
# (-fsanitize=fuzzer,address,undefined) and registers a bounded ctest run of SECONDS (default 10)
# over a build-dir corpus seeded from fuzz/corpus_<name>/ (read only). Works in the default gcc
# configuration: clang++ is run on the side, so the rest of the build keeps its compiler. Nothing
# happens when clang++ or its libFuzzer runtime is missing (the probe result is cached).
# A longer run, by hand:  build/<dir>/<name> -max_total_time=3600 -rss_limit_mb=2048 <corpus dirs>
# CTRUN_CLANG_FUZZERS=OFF leaves them out (the test command's sanitizer pass: they are ASan+UBSan
# builds already and run in its first pass).
option(CTRUN_CLANG_FUZZERS "Build the libFuzzer targets with clang++ when it is found" ON)
find_program(CTRUN_CLANGXX NAMES clang++ clang++-14)

function(ctrun_clang_fuzzer_available out)
  if(NOT CTRUN_CLANG_FUZZERS OR NOT CTRUN_CLANGXX)
    set(${out} OFF PARENT_SCOPE)
    return()
  endif()
  if(NOT DEFINED CTRUN_CLANG_FUZZER_OK)
    file(WRITE ${CMAKE_BINARY_DIR}/fuzz_probe.cc
         "#include <cstdint>\n#include <cstddef>\nextern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
    execute_process(COMMAND ${CTRUN_CLANGXX} -fsanitize=fuzzer ${CMAKE_BINARY_DIR}/fuzz_probe.cc
                            -o ${CMAKE_BINARY_DIR}/fuzz_probe
                    RESULT_VARIABLE _probe OUTPUT_QUIET ERROR_QUIET)
    if(_probe EQUAL 0)
      set(CTRUN_CLANG_FUZZER_OK ON CACHE INTERNAL "")
    else()
      set(CTRUN_CLANG_FUZZER_OK OFF CACHE INTERNAL "")
    endif()
  endif()
  set(${out} ${CTRUN_CLANG_FUZZER_OK} PARENT_SCOPE)
endfunction()

function(ctrun_clang_fuzzer name)
  cmake_parse_arguments(A "" "SECONDS;LABEL" "SOURCES;DEFINES;LIBS" ${ARGN})
  ctrun_clang_fuzzer_available(ok)
  if(NOT ok)
    return()
  endif()
  if(NOT A_SECONDS)
    set(A_SECONDS 10)
  endif()
  set(bin ${CMAKE_CURRENT_BINARY_DIR}/${name})
  set(srcs ${PROJECT_SOURCE_DIR}/fuzz/${name}.cc)
  foreach(s ${A_SOURCES})
    list(APPEND srcs ${PROJECT_SOURCE_DIR}/${s})
  endforeach()
  set(defs)
  foreach(d ${A_DEFINES})
    list(APPEND defs -D${d})
  endforeach()
  file(GLOB_RECURSE deps CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/*.h ${PROJECT_SOURCE_DIR}/include/*.h)
  add_custom_command(
    OUTPUT ${bin}
    COMMAND ${CTRUN_CLANGXX} -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
            -I${PROJECT_SOURCE_DIR}/src -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src/worker ${defs}
            ${srcs} ${A_LIBS} -o ${bin}
    DEPENDS ${srcs} ${deps}
    COMMENT "clang++ libFuzzer build of ${name}"
    VERBATIM)
  add_custom_target(ctrun_${name} ALL DEPENDS ${bin})
  if(CTRUN_BUILD_TESTS)
    file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/corpus_${name})
    # New inputs go to the build-dir corpus (first directory); the checked-in seeds are read only.
    add_test(NAME ${name}
             COMMAND ${bin} -max_total_time=${A_SECONDS} -max_len=4096 -rss_limit_mb=1024 -malloc_limit_mb=512
                     ${CMAKE_CURRENT_BINARY_DIR}/corpus_${name} ${PROJECT_SOURCE_DIR}/fuzz/corpus_${name})
    set_tests_properties(${name} PROPERTIES LABELS ${A_LABEL} TIMEOUT 120)
  endif()
endfunction()
