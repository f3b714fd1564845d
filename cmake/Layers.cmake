# Layering by the build (ARCHITECTURE.md). Each library target says which layer it is; every
# header of services/gpu-worker, services/llm-proxy and services/coordinator includes its folder's
# layer.h first, which fails the compile (#error "layering: ...") in a library of a layer that
# may not see it, however the include is spelled and however deep it is nested. A service's
# main.cc, which wires the parts, and the CLI, which embeds them all, belong to no layer.
function(kforge_layer target layer)
  target_compile_definitions(${target} PRIVATE KFORGE_LAYER_${layer}=1)
endfunction()

# The guard has a hole where a header lacks it: checked at configure time (a new header makes
# CMake configure again).
set(missing)
foreach(folder services/gpu-worker services/llm-proxy services/coordinator)
  file(GLOB headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/${folder}/*.h)
  foreach(h ${headers})
    if(NOT h STREQUAL "${folder}/layer.h")
      file(READ ${PROJECT_SOURCE_DIR}/${h} text)
      string(FIND "${text}" "#include \"${folder}/layer.h\"" at)
      if(at EQUAL -1)
        list(APPEND missing ${h})
      endif()
    endif()
  endforeach()
endforeach()
if(missing)
  message(FATAL_ERROR "layering: these headers do not include their folder's layer.h: ${missing}")
endif()
