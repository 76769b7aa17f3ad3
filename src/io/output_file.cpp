#include "nmkit/io/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <system_error>

#include "nmkit/error.hpp"

namespace nmkit {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::io_error, path + ": " + what);
}

std::string errno_text() { return std::strerror(errno); }

constexpr int kMaxNameAttempts = 100;  // temporary names tried past leftovers of earlier runs

// While a temporary file exists, SIGINT and SIGTERM (when the program left them at their default action, as
// the CLI does) first remove it, then end the process as they would have. A program with handlers of its own
// (Python's) keeps them: the write then finishes or fails and cleans up on the ordinary path.
class InterruptCleanup {
 public:
  explicit InterruptCleanup(const std::string& temporary) : lock_(mutex_, std::try_to_lock) {
    if (!lock_.owns_lock() || temporary.size() >= sizeof(path_)) return;  // another write holds the slot
    std::memcpy(path_, temporary.c_str(), temporary.size() + 1);
    for (std::size_t i = 0; i < kSignals.size(); ++i) {
      struct sigaction current {};
      if (::sigaction(kSignals[i], nullptr, &current) != 0 || current.sa_handler != SIG_DFL) continue;
      struct sigaction cleanup {};
      cleanup.sa_handler = &on_signal;
      sigemptyset(&cleanup.sa_mask);
      installed_[i] = ::sigaction(kSignals[i], &cleanup, nullptr) == 0;
    }
  }
  ~InterruptCleanup() {
    for (std::size_t i = 0; i < kSignals.size(); ++i)
      if (installed_[i]) ::signal(kSignals[i], SIG_DFL);
  }
  InterruptCleanup(const InterruptCleanup&) = delete;
  InterruptCleanup& operator=(const InterruptCleanup&) = delete;

 private:
  static constexpr std::array<int, 2> kSignals{SIGINT, SIGTERM};

  static void on_signal(int signal_number) {  // async-signal-safe calls only
    ::unlink(path_);
    ::signal(signal_number, SIG_DFL);
    ::raise(signal_number);
  }

  static inline std::mutex mutex_;
  static inline char path_[4096] = {};
  std::unique_lock<std::mutex> lock_;
  std::array<bool, 2> installed_{};
};

}  // namespace

std::string resolve_output_path(const std::string& path, std::span<const std::string> inputs) {
  if (path.empty()) throw Error(ErrorCode::io_error, "the output path is empty");
  // Follow a chain of links by hand: weakly_canonical would stop at a dangling one, and the rename would then
  // replace the link instead of writing where it points.
  constexpr int kMaxLinks = 40;  // the kernel's own limit (ELOOP)
  fs::path followed = path;
  std::error_code ec;
  for (int links = 0; fs::is_symlink(fs::symlink_status(followed, ec)); ++links) {
    if (links == kMaxLinks) fail(path, "too many levels of symbolic links");
    const fs::path next = fs::read_symlink(followed, ec);
    if (ec) fail(path, "cannot read the symbolic link: " + ec.message());
    followed = next.is_absolute() ? next : followed.parent_path() / next;
  }
  const fs::path target = fs::weakly_canonical(followed, ec);
  if (ec) fail(path, "cannot resolve the output path: " + ec.message());
  // The temporary file and the rename need the directory: a missing or read-only one fails now, not after the work.
  const fs::path directory = target.has_parent_path() ? target.parent_path() : fs::path(".");
  struct stat dir {};
  if (::stat(directory.c_str(), &dir) != 0)
    fail(path, "the directory '" + directory.string() + "' " + (errno == ENOENT ? "does not exist" : errno_text()));
  if (!S_ISDIR(dir.st_mode)) fail(path, "'" + directory.string() + "' is not a directory");
  if (::access(directory.c_str(), W_OK | X_OK) != 0)
    fail(path, "cannot create files in the directory '" + directory.string() + "': " + errno_text());
  struct stat out {};
  if (::stat(target.c_str(), &out) != 0) {
    if (errno == ENOENT) return target.string();
    fail(path, "cannot inspect the output path: " + errno_text());
  }
  if (!S_ISREG(out.st_mode))
    fail(path, S_ISDIR(out.st_mode)
                   ? "the output is a directory"
                   : "the output is not a regular file (a device, FIFO or socket); refusing to replace it");
  for (const std::string& input : inputs) {
    struct stat in {};
    if (::stat(input.c_str(), &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino)
      fail(path, "the output is the input file '" + input + "'; refusing to overwrite it");
  }
  return target.string();
}

void write_file_atomically(const std::string& path, std::span<const std::byte> bytes) {
  const std::string target = resolve_output_path(path);
  struct stat existing {};
  const bool replaces = ::stat(target.c_str(), &existing) == 0;
  // A name no other write uses: the process id alone could be a killed run's leftover (containers reuse pids).
  static std::atomic<uint64_t> writes{0};
  std::string temporary;
  std::optional<InterruptCleanup> cleanup;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    temporary = target + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(writes++);
    cleanup.reset();
    cleanup.emplace(temporary);
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == kMaxNameAttempts)) fail(temporary, "cannot create: " + errno_text());
  }
  auto abandon = [&](const std::string& what) {
    const std::string reason = errno_text();
    ::close(fd);
    ::unlink(temporary.c_str());
    fail(temporary, what + ": " + reason);
  };
  if (replaces && ::fchmod(fd, existing.st_mode & 07777) != 0) abandon("cannot copy the target's permissions");
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) abandon("write failed");
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) abandon("flush failed");
  if (::close(fd) != 0) {
    const std::string reason = errno_text();
    ::unlink(temporary.c_str());
    fail(temporary, "close failed: " + reason);
  }
  if (::rename(temporary.c_str(), target.c_str()) != 0) {
    const std::string reason = errno_text();
    ::unlink(temporary.c_str());
    fail(target, "cannot rename the temporary file into place: " + reason);
  }
}

}  // namespace nmkit
