# Warning set for ctrun's own targets; -Werror in CI (CTRUN_WERROR=ON). Sanitizers via CTRUN_SANITIZE.
function(ctrun_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor
                         -Wno-missing-field-initializers)
  if(CTRUN_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

if(CTRUN_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  # GCC 12's flow analysis under the sanitizers reports std::function members inside <regex> as
  # maybe-uninitialized (a known false positive); with -Werror it would stop the build.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
  add_link_options(-fsanitize=address,undefined)
endif()
