// Tests of opening user-named files (runtime/base/regular_file.h and its users MappedFile and
// sha256_file): a FIFO, a directory, a character device and a socket are refused at once, never
// blocking in open(); regular files are read with a size bound.
//
// Every call that could block on a FIFO runs under a 5 s guard: on timeout the test fails and
// opens the FIFO's write end (and closes it) so the blocked open() returns and the test ends.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <string>

#include <gtest/gtest.h>

#include "runtime/base/mapped_file.h"
#include "runtime/base/regular_file.h"
#include "runtime/base/sha256.h"

namespace sx {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/sx_regular_file_XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    path_ = p != nullptr ? p : "";
  }
  ~TempDir() {
    if (!path_.empty()) std::system(("rm -rf '" + path_ + "'").c_str());
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs f() on another thread; if it has not returned after 5 s (blocked in open() on `fifo`), the
// test fails and the FIFO gets a writer that closes at once, so the reader sees EOF and returns.
template <class F>
auto guarded(const std::string& fifo, F f) -> decltype(f()) {
  auto future = std::async(std::launch::async, f);
  if (future.wait_for(std::chrono::seconds(5)) == std::future_status::timeout) {
    ADD_FAILURE() << "still blocked after 5 s opening the FIFO " << fifo;
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
  }
  return future.get();
}

TEST(RegularFile, MappedFileRefusesAFifoWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.file("model.gguf");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = guarded(fifo, [&] { return MappedFile::open(fifo); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), fifo + ": not a regular file (a FIFO)");
}

TEST(RegularFile, Sha256FileRefusesAFifoWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.file("model.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = guarded(fifo, [&] { return sha256_file(fifo); });
  ASSERT_FALSE(r.ok()) << "hashed a FIFO: " << *r;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), fifo + ": not a regular file (a FIFO)");
}

TEST(RegularFile, MappedFileNamesTheKindOfFile) {
  TempDir dir;
  auto directory = MappedFile::open(dir.file(""));
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("not a regular file (a directory)"), std::string::npos)
      << directory.status().message();
  auto device = MappedFile::open("/dev/null");
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().message(), "/dev/null: not a regular file (a character device)");
}

TEST(RegularFile, OpenNamesEveryKindAndNeverBlocks) {
  TempDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = guarded(fifo, [&] { return open_regular_file(fifo); });
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(), fifo + ": not a regular file (a FIFO)");
  auto text = guarded(fifo, [&] { return read_regular_file(fifo, 100, "config 'x'"); });
  EXPECT_EQ(text.status().message(), "config 'x': not a regular file (a FIFO)");

  // A Unix socket file cannot be opened at all (ENXIO); it is named as a socket.
  const std::string sock = dir.file("sock");
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock.c_str());
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(open_regular_file(sock).status().message(), sock + ": not a regular file (a socket)");
  ::close(s);

  EXPECT_EQ(open_regular_file(dir.file(".")).status().message(), dir.file(".") + ": not a regular file (a directory)");
  EXPECT_EQ(open_regular_file("/dev/zero").status().message(), "/dev/zero: not a regular file (a character device)");
  auto missing = open_regular_file(dir.file("nope"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), dir.file("nope") + ": No such file or directory");

  // A symlink to a FIFO is the FIFO.
  const std::string link = dir.file("link");
  ASSERT_EQ(::symlink(fifo.c_str(), link.c_str()), 0);
  EXPECT_EQ(guarded(fifo, [&] { return open_regular_file(link); }).status().message(),
            link + ": not a regular file (a FIFO)");
}

TEST(RegularFile, OpenGivesABlockingDescriptorAndTheSize) {
  TempDir dir;
  const std::string path = dir.file("a.txt");
  std::ofstream(path) << "hello";
  auto f = open_regular_file(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->size, 5u);
  const int flags = ::fcntl(f->fd.get(), F_GETFL);
  EXPECT_EQ(flags & O_NONBLOCK, 0);
  EXPECT_EQ(flags & O_ACCMODE, O_RDONLY);
  EXPECT_NE(::fcntl(f->fd.get(), F_GETFD) & FD_CLOEXEC, 0);
  char buf[8];
  EXPECT_EQ(::read(f->fd.get(), buf, sizeof(buf)), 5);
}

TEST(RegularFile, ReadIsBoundedBeforeReading) {
  TempDir dir;
  const std::string path = dir.file("a.yaml");
  std::ofstream(path) << std::string(100, 'x');
  auto exact = read_regular_file(path, 100);
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  EXPECT_EQ(*exact, std::string(100, 'x'));
  auto over = read_regular_file(path, 99);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(over.status().message(), path + ": 100 bytes, more than the limit of 99 bytes");
  const std::string empty = dir.file("empty");
  std::ofstream(empty).flush();
  auto nothing = read_regular_file(empty, 0);
  ASSERT_TRUE(nothing.ok());
  EXPECT_EQ(*nothing, "");
  // A file whose size fstat cannot tell (it reads 0) is still cut at the limit: /proc files.
  auto proc = read_regular_file("/proc/self/status", 10);
  ASSERT_FALSE(proc.ok());
  EXPECT_EQ(proc.status().message(), "/proc/self/status: at least 11 bytes, more than the limit of 10 bytes");
  auto proc_all = read_regular_file("/proc/self/status", 1u << 20);
  ASSERT_TRUE(proc_all.ok()) << proc_all.status().to_string();
  EXPECT_NE(proc_all->find("Pid:"), std::string::npos);
}

// Issue 39 item 4: on a full disk the start summary became 0 bytes on every update. A write that
// fails leaves the old content and no temporary file (RLIMIT_FSIZE stands for the full disk: the
// write fails with EFBIG as it would with ENOSPC).
TEST(RegularFile, AtomicWriteLeavesTheOldFileWhenTheWriteFails) {
  TempDir dir;
  const std::string path = dir.file("start.json");
  ASSERT_TRUE(write_file_atomically(path, "{\"state\": \"serving\"}\n").ok());
  auto before = read_regular_file(path, 1 << 20);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(*before, "{\"state\": \"serving\"}\n");
  EXPECT_EQ(open_regular_file(path).ok(), true);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // In a child: the file-size limit (its SIGXFSZ ignored) fails the write half-way.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{8, 8};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    const Status s = write_file_atomically(path, std::string(4096, 'x'));
    ::_exit(!s.ok() && s.message().find(path) == 0 ? 0 : 1);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "the write did not fail with an error naming the file";
  auto after = read_regular_file(path, 1 << 20);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, *before);
  EXPECT_NE(::access((path + ".tmp." + std::to_string(pid)).c_str(), F_OK), 0) << "the temporary file was left";
}

// Issue 39 item 2: dlopen() of a FIFO named by SEXTANT_CUDA_MODULE / SEXTANT_VULKAN_LOADER blocked.
TEST(RegularFile, LibraryPathsAreRegularFilesOrSearchNames) {
  TempDir dir;
  const std::string fifo = dir.file("libvulkan.so.1");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Status s = guarded(fifo, [&] { return check_library_path(fifo, "SEXTANT_VULKAN_LOADER " + fifo); });
  EXPECT_EQ(s.message(), "SEXTANT_VULKAN_LOADER " + fifo + ": not a regular file (a FIFO)");
  EXPECT_TRUE(check_library_path("libvulkan.so.1").ok());  // no '/': the loader's search, not a path
  EXPECT_EQ(check_library_path(dir.file("missing.so")).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace sx
