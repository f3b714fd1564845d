// Compiled by the LayeringTest cases in tests/CMakeLists.txt, not linked: once as a library of
// the coordinator's layer (which must fail: the worker's header refuses it), once as no layer
// (which must compile: the failure above is the guard's, not a broken probe).
#include <services/gpu-worker/sample_stats.h>

int main() { return 0; }
