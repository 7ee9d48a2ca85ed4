# kvcache_library(NAME <name> SRCS ... DEPS ...): one library per folder, aliased kvcache::<name>,
# the name it is also exported under where it is installed (cmake/kvcache_install.cmake). Headers
# are included from the source root ("client/kv_cache_client.h"), installed or not.
function(kvcache_library)
  cmake_parse_arguments(KV "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(kvcache_${KV_NAME} STATIC ${KV_SRCS})
  add_library(kvcache::${KV_NAME} ALIAS kvcache_${KV_NAME})
  set_target_properties(kvcache_${KV_NAME} PROPERTIES EXPORT_NAME ${KV_NAME})
  target_include_directories(kvcache_${KV_NAME} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<INSTALL_INTERFACE:${KVCACHE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(kvcache_${KV_NAME} PUBLIC ${KV_DEPS})
endfunction()

# kvcache_test(NAME <name> SRCS ... DEPS ... [LABELS ...]): a GoogleTest binary registered with CTest.
function(kvcache_test)
  cmake_parse_arguments(KV "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${KV_NAME} ${KV_SRCS})
  target_link_libraries(${KV_NAME} PRIVATE ${KV_DEPS} kvcache::testing GTest::gtest GTest::gtest_main)
  if(KVCACHE_TSAN)
    # Debian's absl::Mutex made visible to TSan (the file says how); dlsym needs libdl.
    target_sources(${KV_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests/testing/tsan_absl_mutex.cc)
    target_link_libraries(${KV_NAME} PRIVATE ${CMAKE_DL_LIBS})
  endif()
  add_test(NAME ${KV_NAME} COMMAND ${KV_NAME})
  set_tests_properties(${KV_NAME} PROPERTIES TIMEOUT 300
    ENVIRONMENT "KVCACHE_BIN_DIR=${PROJECT_BINARY_DIR}/bin;KVCACHE_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(KV_LABELS)
    set_tests_properties(${KV_NAME} PROPERTIES LABELS "${KV_LABELS}")
  endif()
  # GPU cases GTEST_SKIP with "no CUDA device" on a machine without one: CTest reports them as
  # skipped, not passed.
  if("gpu" IN_LIST KV_LABELS)
    set_tests_properties(${KV_NAME} PROPERTIES SKIP_REGULAR_EXPRESSION "no CUDA device")
  endif()
endfunction()

# kvcache_gpu_test(NAME <name>_test SRCS ... DEPS ... GPU_FILTER <gtest pattern> [NEEDS_NCCL]
#                  [LABELS ...]):
# one binary that mixes unit cases with GPU cases (those GPU_FILTER matches; compiled under
# #if KVCACHE_WITH_CUDA, or KVCACHE_WITH_NCCL with NEEDS_NCCL, or asking BuiltWithCuda(), and
# skipping with "no CUDA device" where there is none), two CTest entries: <name>_test (label unit
# and LABELS) runs every case but the GPU ones, in every build; <name>_gpu_test (label gpu) runs
# only the GPU cases, where they are built.
function(kvcache_gpu_test)
  cmake_parse_arguments(KV "NEEDS_NCCL" "NAME;GPU_FILTER" "SRCS;DEPS;LABELS" ${ARGN})
  kvcache_test(NAME ${KV_NAME} SRCS ${KV_SRCS} DEPS ${KV_DEPS} LABELS unit ${KV_LABELS})
  set_property(TEST ${KV_NAME} APPEND PROPERTY ENVIRONMENT "GTEST_FILTER=-${KV_GPU_FILTER}")
  if(KVCACHE_WITH_CUDA AND (KVCACHE_WITH_NCCL OR NOT KV_NEEDS_NCCL))
    string(REGEX REPLACE "_test$" "_gpu_test" gpu_name ${KV_NAME})
    add_test(NAME ${gpu_name} COMMAND ${KV_NAME} --gtest_filter=${KV_GPU_FILTER})
    set_tests_properties(${gpu_name} PROPERTIES LABELS gpu TIMEOUT 300
      SKIP_REGULAR_EXPRESSION "no CUDA device"
      ENVIRONMENT "KVCACHE_BIN_DIR=${PROJECT_BINARY_DIR}/bin;KVCACHE_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  endif()
endfunction()

# kvcache_cuda_sources(<target> REAL <src>... STUB <src>... [NCCL]): the one real-vs-stub switch.
# Adds the REAL sources and links CUDA::cudart (and NCCL with NCCL) when the build has CUDA (and
# NCCL: KVCACHE_WITH_NCCL); otherwise the STUB sources, which answer NotBuiltWith
# (common/cuda/not_built.h). Stubs hold only what calls CUDA; the rest is built either way.
function(kvcache_cuda_sources target)
  cmake_parse_arguments(KV "NCCL" "" "REAL;STUB" ${ARGN})
  if(KVCACHE_WITH_CUDA AND (NOT KV_NCCL OR KVCACHE_WITH_NCCL))
    target_sources(${target} PRIVATE ${KV_REAL})
    target_link_libraries(${target} PUBLIC CUDA::cudart)
    if(KV_NCCL)
      target_link_libraries(${target} PUBLIC ${KVCACHE_NCCL_LIBRARY})
    endif()
  else()
    target_sources(${target} PRIVATE ${KV_STUB})
  endif()
endfunction()
