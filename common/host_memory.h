#pragma once

namespace kforge {

// Keeps large allocations (kernel buffers of tens of MB, and the frames that carry them) in the
// heap instead of glibc's default per-allocation mmap. Without this every buffer of 32 MB or more
// is mapped, page-faulted and zeroed afresh on each sandbox call; with it the pages are reused.
// Call once at the start of main in processes that move kernel buffers (worker, sandbox, CLI).
// Returns false when the C library refused the settings (then nothing changed).
[[nodiscard]] bool KeepLargeAllocationsInHeap();

}  // namespace kforge
