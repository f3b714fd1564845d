# Warnings apply to our targets only (generated protobuf code is compiled without them).
function(kforge_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter
                                           -Wnon-virtual-dtor -Wimplicit-fallthrough)
  if(KFORGE_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
