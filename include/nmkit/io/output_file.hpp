#pragma once
// Output files written so that a failed or interrupted write never damages what stood at the path.
#include <cstddef>
#include <span>
#include <string>

namespace nmkit {

// The file a write to `path` lands on: symbolic links followed, `.` and `..` resolved. Throws Error(io_error)
// when its directory is missing or not writable, when that file exists and is not a regular file (a device, a
// directory, a FIFO), or when it is one of `inputs` (the same device and inode, however the path is spelt). Call it
// before long work, so that a bad output path fails at once.
std::string resolve_output_path(const std::string& path, std::span<const std::string> inputs = {});

// Writes `bytes` to resolve_output_path(path) atomically: a temporary file beside the target, flushed, then
// renamed over it. An existing target keeps its permission bits. On an error, or on SIGINT/SIGTERM while the
// process has their default actions, the temporary file is removed and the target is left as it was.
void write_file_atomically(const std::string& path, std::span<const std::byte> bytes);

}  // namespace nmkit
