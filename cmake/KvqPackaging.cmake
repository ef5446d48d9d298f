# Packaging: the static libkvq.a (target kvq; the tools and tests link it, as they
# use internal symbols), a shared libkvq.so.0 (target kvq_shared) made from the same
# objects that exports only the KVQ_API functions of kvq.h, the install rules, and a
# kvq.pc whose prefix is relative to where it is installed.

# Hidden by default: only what kvq.h marks KVQ_API leaves the shared library. PIC so
# the same archive can be linked whole into the .so.
set_target_properties(kvq PROPERTIES C_VISIBILITY_PRESET hidden POSITION_INDEPENDENT_CODE ON)

file(RELATIVE_PATH KVQ_DEMO_FROM_LIB "/p/${CMAKE_INSTALL_LIBDIR}" "/p/${CMAKE_INSTALL_DATADIR}/kvq/models/demo")
file(RELATIVE_PATH KVQ_DEMO_FROM_BIN "/p/${CMAKE_INSTALL_BINDIR}" "/p/${CMAKE_INSTALL_DATADIR}/kvq/models/demo")
target_compile_definitions(kvq PRIVATE
  KVQ_VERSION_STRING="${PROJECT_VERSION}"
  KVQ_DEMO_FROM_LIB="${KVQ_DEMO_FROM_LIB}"
  KVQ_DEMO_FROM_BIN="${KVQ_DEMO_FROM_BIN}"
  KVQ_DEMO_INSTALLED="${CMAKE_INSTALL_FULL_DATADIR}/kvq/models/demo"
  KVQ_DEMO_SOURCE="${CMAKE_SOURCE_DIR}/models/demo")
target_link_libraries(kvq PRIVATE ${CMAKE_DL_LIBS})

add_library(kvq_shared SHARED ${CMAKE_SOURCE_DIR}/cmake/kvq_shared.c)
set_target_properties(kvq_shared PROPERTIES OUTPUT_NAME kvq VERSION ${PROJECT_VERSION} SOVERSION 0 C_VISIBILITY_PRESET hidden)
target_include_directories(kvq_shared PUBLIC $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include> $<INSTALL_INTERFACE:include>)
# every object of libkvq.a goes in; kvq's own link dependencies follow it
target_link_libraries(kvq_shared PRIVATE -Wl,--whole-archive kvq -Wl,--no-whole-archive)
if(NOT KVQ_SANITIZE AND NOT KVQ_FUZZ) # sanitizer runtimes come with the program, not the .so
  target_link_options(kvq_shared PRIVATE -Wl,--no-undefined)
endif()

install(TARGETS kvq kvq_shared ${KVQ_TOOLS}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY models/demo DESTINATION ${CMAKE_INSTALL_DATADIR}/kvq/models)

# kvq.pc: prefix=${pcfiledir}/<back to the prefix>, so `cmake --install --prefix X` works.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(KVQ_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH KVQ_PC_UP "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
  string(REGEX REPLACE "/$" "" KVQ_PC_UP "${KVQ_PC_UP}")
  set(KVQ_PC_PREFIX "\${pcfiledir}/${KVQ_PC_UP}")
endif()
set(KVQ_PC_BLAS "")
if(BLAS_FOUND)
  set(KVQ_PC_BLAS "-lopenblas")
endif()
configure_file(cmake/kvq.pc.in ${CMAKE_BINARY_DIR}/kvq.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/kvq.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
