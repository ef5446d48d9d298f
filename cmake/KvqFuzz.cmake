# KVQ_FUZZ=ON: the library and tools are instrumented for libFuzzer coverage
# (-fsanitize=fuzzer-no-link) under ASan + UBSan, and fuzz/ builds one libFuzzer
# executable per target. Needs clang; use its own build directory (tools/fuzz.sh
# makes build-fuzz).
if(KVQ_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "KVQ_FUZZ needs clang (CC=clang-14 cmake -B build-fuzz -DKVQ_FUZZ=ON)")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined -g)
  add_link_options(-fsanitize=address,undefined)
endif()
