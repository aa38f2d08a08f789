# Included by cpack before it packages (CPACK_PROJECT_CONFIG_FILE): a package that would be wrong
# is refused with one line instead.
if(NOT CPACK_ACCELFS_INSTALL_PREFIX STREQUAL "/usr")
  message(FATAL_ERROR
    "accelfs: the package needs a build configured with -DCMAKE_INSTALL_PREFIX=/usr (this one has "
    "${CPACK_ACCELFS_INSTALL_PREFIX}, which its systemd units would name): run tools/setup.sh "
    "package")
endif()
if(NOT CPACK_ACCELFS_MAN_PAGES)
  message(FATAL_ERROR
    "accelfs: the package needs its man pages: apt install help2man, then configure and build again")
endif()
