# `cmake --install build --prefix P` installs:
# - the binaries: kvcache-manager, kvcachectl, kvcache-worker, kvcache-pd, kvcache-demo (P/bin);
# - the C++ client, kvcache::client, with the libraries its public headers need (kvcache::proto,
#   the generated v1 API; kvcache::common; kvcache::rpc; kvcache::cuda; kvcache::kernels, whose
#   page checksum kernel the device page calls use) as static libraries
#   (P/lib) and their headers (P/include/kvcache);
# - the CMake package (P/lib/cmake/kvcache), so another service does
#     find_package(kvcache 0.1 REQUIRED)
#     target_link_libraries(app PRIVATE kvcache::client)
#   and gets gRPC, protobuf, abseil and OpenSSL found for it (find_dependency).
# tests/install checks all of it: a consumer project built against an installed tree talks to the
# installed daemon.
include(CMakePackageConfigHelpers)

set(KVCACHE_CMAKE_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvcache)

install(TARGETS kvcache-manager kvcachectl kvcache-worker kvcache-pd kvcache-demo
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

install(TARGETS kvcache_proto kvcache_common kvcache_rpc kvcache_cuda kvcache_kernels kvcache_client
        EXPORT kvcacheTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The client's headers and every header of common/ (the client's include the pool layout, the
# hash chain and the checksums; common/rpc and common/cuda come along, small and self-contained).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/client ${PROJECT_SOURCE_DIR}/common
        DESTINATION ${KVCACHE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "python" EXCLUDE)
install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/kvcache DESTINATION ${KVCACHE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.pb.h")
install(EXPORT kvcacheTargets NAMESPACE kvcache:: DESTINATION ${KVCACHE_CMAKE_PACKAGE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvcacheConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvcacheConfig.cmake INSTALL_DESTINATION ${KVCACHE_CMAKE_PACKAGE_DIR})
# 0.x: a minor version may break the API, so 0.1 accepts 0.1.y only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvcacheConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvcacheConfig.cmake
              ${PROJECT_BINARY_DIR}/kvcacheConfigVersion.cmake
        DESTINATION ${KVCACHE_CMAKE_PACKAGE_DIR})
