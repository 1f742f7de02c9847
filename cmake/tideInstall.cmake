include(CMakePackageConfigHelpers)

set(tide_config_dir "${CMAKE_INSTALL_DATADIR}/tide/cmake")

install(DIRECTORY include/ DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS tide_tide ${tide_optional_targets} EXPORT tideTargets)
install(EXPORT tideTargets NAMESPACE tide:: DESTINATION "${tide_config_dir}")

configure_package_config_file(cmake/tideConfig.cmake.in
  "${PROJECT_BINARY_DIR}/tideConfig.cmake"
  INSTALL_DESTINATION "${tide_config_dir}")
# Header-only: the version file does not check the consumer's pointer size.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/tideConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/tideConfig.cmake" "${PROJECT_BINARY_DIR}/tideConfigVersion.cmake"
  DESTINATION "${tide_config_dir}")

# A build-tree export, so find_package(tide) also works against a build directory.
export(EXPORT tideTargets NAMESPACE tide:: FILE "${PROJECT_BINARY_DIR}/tideTargets.cmake")
