/* libkvq.so is libkvq.a linked whole (cmake/KvqPackaging.cmake); CMake wants a source. */
typedef int kvq_shared_lib_unit;
