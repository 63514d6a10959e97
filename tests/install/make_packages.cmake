# cmake -DCPACK=<cpack> -DCONFIG=<build>/CPackConfig.cmake -DOUT=<dir> -P make_packages.cmake
# Builds the Debian packages into a fresh OUT (the fixture of ctrun_package_tests). Exits 77 (ctest:
# skipped) when dpkg-shlibdeps is missing.
find_program(SHLIBDEPS dpkg-shlibdeps)
if(NOT SHLIBDEPS)
  message("dpkg-shlibdeps not found: install the Debian package dpkg-dev (listed in scripts/debian-packages.txt)")
  cmake_language(EXIT 77)
endif()
file(REMOVE_RECURSE ${OUT})
execute_process(COMMAND ${CPACK} -G DEB --config ${CONFIG} -B ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cpack -G DEB failed (${rc})")
endif()
