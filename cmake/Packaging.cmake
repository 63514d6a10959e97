# Installation (GNU install dirs) and the Debian packages.
#
#   cmake --install build [--prefix P] [--component agent|worker]
#   cd build && cpack -G DEB    -> ctrun_<version>_<arch>.deb, ctrun-dev_<version>_<arch>.deb
#
# Component "agent" (package ctrun): bin/ctrun, the torchrun alias libexec/ctrun/torchrun, the shell
# completions and ctrun(1) (src/docgen), README + docs. It is all ctrun needs at run time: ctrun
# reads nothing from the source or build tree. Depends come from dpkg-shlibdeps: no LibTorch, no CUDA.
# Component "worker" (package ctrun-dev): the worker library, its headers and the CMake package
# config (src/worker/CMakeLists.txt).
include(GNUInstallDirs)

install(TARGETS ctrun RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT agent)
if(TARGET ct-watchdog)
  install(TARGETS ct-watchdog RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/ctrun COMPONENT agent)
endif()

# `torchrun` -> ctrun, a relative link, outside PATH: job scripts opt in with
# PATH=<prefix>/libexec/ctrun:$PATH, or an admin makes it /usr/bin/torchrun with update-alternatives.
file(RELATIVE_PATH ctrun_alias_target /p/${CMAKE_INSTALL_LIBEXECDIR}/ctrun /p/${CMAKE_INSTALL_BINDIR}/ctrun)
file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/alias)
file(CREATE_LINK ${ctrun_alias_target} ${PROJECT_BINARY_DIR}/alias/torchrun SYMBOLIC)
install(FILES ${PROJECT_BINARY_DIR}/alias/torchrun DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/ctrun COMPONENT agent)

install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT agent)
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs COMPONENT agent FILES_MATCHING PATTERN "*.md")
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} RENAME copyright COMPONENT agent)
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/ctrun-dev RENAME copyright COMPONENT worker)

# --- cpack -G DEB ---------------------------------------------------------------------------------
option(CTRUN_DEB_TORCHRUN_ALTERNATIVE
       "The ctrun package registers its torchrun alias as the /usr/bin/torchrun alternative" OFF)

set(CPACK_PACKAGE_NAME ctrun)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "ctrun maintainers <maintainers@users.noreply.a-seed-f825686b.example>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL agent worker)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_AGENT_PACKAGE_NAME ctrun)
set(CPACK_DEBIAN_AGENT_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_AGENT_PACKAGE_RECOMMENDS "libcurl4, libhwloc15")  # dlopen()ed by etcd / the binding flags only
set(CPACK_DEBIAN_AGENT_PACKAGE_SUGGESTS "python3-torch")
set(CPACK_DEBIAN_AGENT_DESCRIPTION "elastic launcher for PyTorch training, a drop-in replacement for torchrun
ctrun starts, supervises and restarts the workers of a multi-GPU, multi-node training job with
torchrun's command line, environment and failure summary, event-driven and in a few MiB. It links
no LibTorch and no CUDA. A torchrun alias is in /usr/libexec/ctrun (off by default).")
set(CPACK_DEBIAN_WORKER_PACKAGE_NAME ctrun-dev)
set(CPACK_DEBIAN_WORKER_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_WORKER_DESCRIPTION "worker library for programs launched by ctrun or torchrun
Typed launcher environment, torchelastic error files, heartbeats and an atomic snapshot store
(static library, headers, CMake package: find_package(ctrun)); LibTorch helpers when built with it.")
if(CTRUN_ZSTD_LIB)
  set(CPACK_DEBIAN_WORKER_PACKAGE_DEPENDS "libzstd-dev")  # the static library links it
endif()
if(CTRUN_HAVE_TORCH)
  set(CPACK_DEBIAN_WORKER_PACKAGE_SUGGESTS "libtorch-dev")
endif()

# Maintainer scripts: prerm always drops the alternative (when an admin or postinst made it);
# postinst registers it only with CTRUN_DEB_TORCHRUN_ALTERNATIVE.
set(CTRUN_TORCHRUN_ALIAS ${CPACK_PACKAGING_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBEXECDIR}/ctrun/torchrun)
set(ctrun_deb_scripts ${PROJECT_BINARY_DIR}/debian/prerm)
configure_file(${PROJECT_SOURCE_DIR}/packaging/debian/prerm.in ${PROJECT_BINARY_DIR}/debian/prerm @ONLY
               FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
if(CTRUN_DEB_TORCHRUN_ALTERNATIVE)
  configure_file(${PROJECT_SOURCE_DIR}/packaging/debian/postinst.in ${PROJECT_BINARY_DIR}/debian/postinst @ONLY
                 FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  list(APPEND ctrun_deb_scripts ${PROJECT_BINARY_DIR}/debian/postinst)
else()
  file(REMOVE ${PROJECT_BINARY_DIR}/debian/postinst)
endif()
set(CPACK_DEBIAN_AGENT_PACKAGE_CONTROL_EXTRA ${ctrun_deb_scripts})

include(CPack)
