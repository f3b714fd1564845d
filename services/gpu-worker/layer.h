#pragma once

// Included first by every header of services/gpu-worker: the build fails when a library of
// another layer includes one, whatever the spelling of the include (each library target defines its
// KFORGE_LAYER_*, cmake/Layers.cmake; a service's main.cc, which wires the parts, defines none).
#if defined(KFORGE_LAYER_COORDINATOR) || \
    defined(KFORGE_LAYER_LLM_PROXY) || \
    defined(KFORGE_LAYER_LLM_CLIENT) || \
    defined(KFORGE_LAYER_COMMON)
#error "layering: the worker's headers: the coordinator and the llm-proxy meet the worker only through the WorkQueue port (common/queue), and common/ knows no service (ARCHITECTURE.md)"
#endif
