# The optional Vulkan backend: src/vulkan/*.c plus shaders/*.comp compiled to
# SPIR-V by glslangValidator and embedded in the library (generated/vk_spirv.c).
# shaders/*.glsl are include files shared by several .comp files.
set(KVQ_HAVE_VULKAN OFF)
set(KVQ_VK_SRC)
if(NOT KVQ_VULKAN STREQUAL "OFF")
  find_package(Vulkan QUIET)
  find_program(KVQ_GLSLANG glslangValidator)
  if(Vulkan_FOUND AND KVQ_GLSLANG)
    set(KVQ_HAVE_VULKAN ON)
  elseif(KVQ_VULKAN STREQUAL "ON")
    message(FATAL_ERROR "KVQ_VULKAN=ON but the Vulkan loader/headers (libvulkan-dev) or glslangValidator (glslang-tools) are missing")
  endif()
endif()

if(KVQ_HAVE_VULKAN)
  message(STATUS "kvq: Vulkan backend ON (${KVQ_GLSLANG})")
  file(GLOB KVQ_VK_C CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/vulkan/*.c)
  file(GLOB KVQ_VK_COMP CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/shaders/*.comp)
  file(GLOB KVQ_VK_GLSL CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/shaders/*.glsl)
  set(spvs)
  foreach(comp ${KVQ_VK_COMP})
    get_filename_component(name ${comp} NAME_WE)
    set(spv ${CMAKE_BINARY_DIR}/shaders/${name}.spv)
    add_custom_command(OUTPUT ${spv}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/shaders
      COMMAND ${KVQ_GLSLANG} -V --target-env vulkan1.1 -I${CMAKE_SOURCE_DIR}/shaders -o ${spv} ${comp}
      DEPENDS ${comp} ${KVQ_VK_GLSL}
      COMMENT "glslangValidator ${name}.comp" VERBATIM)
    list(APPEND spvs ${spv})
  endforeach()
  set(gen ${CMAKE_BINARY_DIR}/generated/vk_spirv.c)
  add_custom_command(OUTPUT ${gen}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/generated
    COMMAND ${CMAKE_COMMAND} "-DOUT=${gen}" "-DSPV=${spvs}" -P ${CMAKE_SOURCE_DIR}/cmake/vk_embed.cmake
    DEPENDS ${spvs} ${CMAKE_SOURCE_DIR}/cmake/vk_embed.cmake
    COMMENT "embedding SPIR-V" VERBATIM)
  add_custom_target(kvq_shaders DEPENDS ${gen})
  set(KVQ_VK_SRC ${KVQ_VK_C} ${gen})
else()
  message(STATUS "kvq: Vulkan backend OFF (needs libvulkan-dev and glslang-tools; KVQ_VULKAN=${KVQ_VULKAN}): building the CPU backend only")
endif()
