# Warnings apply to our targets only (generated protobuf code is compiled without them).
function(kforge_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter
                                           -Wnon-virtual-dtor -Wimplicit-fallthrough
                                           # option structs are filled with designated initializers
                                           # that leave the rest at their defaults on purpose
                                           -Wno-missing-field-initializers)
  if(KFORGE_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
