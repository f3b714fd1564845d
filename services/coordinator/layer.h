#pragma once

// Included first by every header of services/coordinator: the build fails when a library of
// another layer includes one, whatever the spelling of the include (each library target defines its
// KFORGE_LAYER_*, cmake/Layers.cmake; a service's main.cc, which wires the parts, defines none).
#if defined(KFORGE_LAYER_WORKER) || \
    defined(KFORGE_LAYER_LLM_PROXY) || \
    defined(KFORGE_LAYER_LLM_CLIENT) || \
    defined(KFORGE_LAYER_COMMON)
#error "layering: the coordinator's headers: neither the worker nor the llm-proxy knows the coordinator, and common/ knows no service (ARCHITECTURE.md)"
#endif
