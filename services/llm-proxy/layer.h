#pragma once

// Included first by every header of services/llm-proxy: the build fails when a library of
// another layer includes one, whatever the spelling of the include (each library target defines its
// KFORGE_LAYER_*, cmake/Layers.cmake; a service's main.cc, which wires the parts, defines none).
#if defined(KFORGE_LAYER_COORDINATOR) || \
    defined(KFORGE_LAYER_WORKER) || \
    defined(KFORGE_LAYER_COMMON)
#error "layering: the llm-proxy's headers: the coordinator reaches it only through its client (services/llm-proxy/client), workers never call models, and common/ knows no service (ARCHITECTURE.md)"
#endif
