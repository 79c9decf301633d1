// runtime/hub: model references, quantisation names and split parts, the Hugging Face cache layout
// (snapshots through refs, what serve loads from one, `ls`, `rm`), revisions, SHA256SUMS, globs
// and the choice of files; the blob lock; and HubClient against a one-thread HTTP server on
// loopback that misbehaves as a hostile hub does (a body past the listed size, an endless or
// trickling listing, redirects to ftp:// and file://, a full disk, Range ignored while two
// downloads share a file). The whole pull is tested end to end against tests/e2e/hub_mirror.py.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/base/sha256.h"
#include "runtime/hub/blob_lock.h"
#include "runtime/hub/hub_cache.h"
#include "runtime/hub/hub_client.h"
#include "runtime/hub/pull.h"

namespace sx::hub {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("sx_hub_" + std::to_string(::getpid()) + "_" +
                                                 ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path path() const { return path_; }

 private:
  fs::path path_;
};

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

TEST(ModelRef, ParsesTheFormsUsersWrite) {
  auto r = parse_model_ref("Qwen/Qwen3-8B");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->repo, "Qwen/Qwen3-8B");
  EXPECT_EQ(r->source, HubSource::kHuggingFace);
  EXPECT_TRUE(r->quant.empty());
  r = parse_model_ref("hf:Qwen/Qwen3-8B-GGUF:Q4_K_M");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->repo, "Qwen/Qwen3-8B-GGUF");
  EXPECT_EQ(r->quant, "Q4_K_M");
  EXPECT_EQ(r->text, "Qwen/Qwen3-8B-GGUF:Q4_K_M");
  r = parse_model_ref("ms:Qwen/Qwen2.5-0.5B-Instruct");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->source, HubSource::kModelScope);
  EXPECT_EQ(r->repo, "Qwen/Qwen2.5-0.5B-Instruct");
  for (const char* bad : {"", "Qwen", "/Qwen3-8B", "Qwen/", "Qwen/Qwen3/8B", "../etc/passwd", "Qwen/..", "Qwen/.x",
                          "Qw en/x", "Qwen:x/y", "Qwen/x:", "Qwen/x:a:b", "models/memorise/memorise-q8_0.gguf"}) {
    auto bad_ref = parse_model_ref(bad);
    EXPECT_FALSE(bad_ref.ok()) << bad;
    if (!bad_ref.ok()) {
      EXPECT_NE(bad_ref.status().message().find("ORG/NAME"), std::string::npos) << bad;
    }
  }
  // A local directory of that name is a path, not a reference.
  TempDir dir;
  const fs::path local = dir.path() / "org" / "name";
  fs::create_directories(local);
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  EXPECT_FALSE(is_model_ref("org/name"));
  EXPECT_TRUE(is_model_ref("org/other"));
  fs::current_path(cwd);
}

TEST(ModelRef, QuantisationsAndSplitParts) {
  EXPECT_TRUE(gguf_matches_quant("qwen3-8b-Q4_K_M.gguf", "Q4_K_M"));
  EXPECT_TRUE(gguf_matches_quant("qwen3-8b.q4_k_m.gguf", "Q4_K_M"));
  EXPECT_TRUE(gguf_matches_quant("Q4_K_M/qwen3-8b-Q4_K_M-00001-of-00002.gguf", "q4_k_m"));
  EXPECT_FALSE(gguf_matches_quant("qwen3-8b-Q4_K_M.gguf", "Q4_K"));  // not a prefix of another quant
  EXPECT_FALSE(gguf_matches_quant("qwen3-8b-IQ4_K_M.gguf", "Q4_K_M"));
  EXPECT_FALSE(gguf_matches_quant("qwen3-8b-Q4_K_M.bin", "Q4_K_M"));
  EXPECT_EQ(gguf_split_part("x-Q4_0-00002-of-00003.gguf"), (std::pair{2, 3}));
  EXPECT_FALSE(gguf_split_part("x-Q4_0.gguf").has_value());
  EXPECT_FALSE(gguf_split_part("x-00004-of-00003.gguf").has_value());
  EXPECT_FALSE(gguf_split_part("x-0000a-of-00003.gguf").has_value());
}

TEST(HubCache, DirectoryFromTheEnvironmentAsHuggingFaceHubDoes) {
  const char* saved[] = {std::getenv("HF_HUB_CACHE"), std::getenv("HF_HOME"), std::getenv("XDG_CACHE_HOME")};
  const std::string keep[] = {saved[0] ? saved[0] : "", saved[1] ? saved[1] : "", saved[2] ? saved[2] : ""};
  ::setenv("HF_HUB_CACHE", "/a/hub", 1);
  ::setenv("HF_HOME", "/b", 1);
  EXPECT_EQ(hub_cache_dir(), "/a/hub");
  ::unsetenv("HF_HUB_CACHE");
  EXPECT_EQ(hub_cache_dir(), "/b/hub");
  ::unsetenv("HF_HOME");
  ::setenv("XDG_CACHE_HOME", "/c", 1);
  EXPECT_EQ(hub_cache_dir(), "/c/huggingface/hub");
  const char* names[] = {"HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"};
  for (int i = 0; i < 3; ++i) {
    if (saved[i] != nullptr) {
      ::setenv(names[i], keep[i].c_str(), 1);
    } else {
      ::unsetenv(names[i]);
    }
  }
  EXPECT_EQ(repo_folder_name("Qwen/Qwen3-8B"), "models--Qwen--Qwen3-8B");
}

// A cache as huggingface_hub lays it out: two blobs, a snapshot of links, refs/main.
std::string fill_cache(const fs::path& cache, bool gguf) {
  const std::string commit(40, 'c');
  const fs::path root = cache / (gguf ? "models--org--m-GGUF" : "models--org--m");
  const std::string sha(64, 'a');
  write(root / "blobs" / sha, "weights");
  write(root / "blobs" / std::string(40, 'b'), "{}");
  write(root / "refs" / "main", commit);
  const fs::path snap = root / "snapshots" / commit;
  fs::create_directories(snap / "sub");
  if (gguf) {
    fs::create_symlink("../../blobs/" + sha, snap / "m-Q8_0.gguf");
    fs::create_symlink("../../blobs/" + sha, snap / "m-Q4_0-00001-of-00002.gguf");
    fs::create_symlink("../../blobs/" + sha, snap / "m-Q4_0-00002-of-00002.gguf");
  } else {
    fs::create_symlink("../../blobs/" + sha, snap / "model.safetensors");
    fs::create_symlink("../../blobs/" + std::string(40, 'b'), snap / "config.json");
    fs::create_symlink("../../../blobs/" + std::string(40, 'b'), snap / "sub" / "notes.json");
  }
  return commit;
}

TEST(HubCache, SnapshotsAndWhatServeLoads) {
  TempDir dir;
  const std::string commit = fill_cache(dir.path(), false);
  fill_cache(dir.path(), true);
  const auto snap = find_snapshot(dir.path(), "org/m", "main");
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(fs::path(*snap).filename(), commit);
  EXPECT_EQ(find_snapshot(dir.path(), "org/m", commit), snap);
  EXPECT_FALSE(find_snapshot(dir.path(), "org/m", "dev").has_value());
  EXPECT_FALSE(find_snapshot(dir.path(), "org/none", "main").has_value());
  EXPECT_FALSE(find_snapshot(dir.path(), "org/m", std::string(40, 'd')).has_value());
  EXPECT_EQ(model_path_in_snapshot(*snap, parse_model_ref("org/m").value()).value(), *snap);
  const auto gsnap = find_snapshot(dir.path(), "org/m-GGUF", "main").value();
  EXPECT_EQ(fs::path(model_path_in_snapshot(gsnap, parse_model_ref("org/m-GGUF:Q8_0").value()).value()).filename(),
            "m-Q8_0.gguf");
  EXPECT_EQ(fs::path(model_path_in_snapshot(gsnap, parse_model_ref("org/m-GGUF:q4_0").value()).value()).filename(),
            "m-Q4_0-00001-of-00002.gguf");
  auto missing = model_path_in_snapshot(gsnap, parse_model_ref("org/m-GGUF:Q6_K").value());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("sextant pull org/m-GGUF:Q6_K"), std::string::npos);
  auto ambiguous = model_path_in_snapshot(gsnap, parse_model_ref("org/m-GGUF").value());
  ASSERT_FALSE(ambiguous.ok());
  EXPECT_NE(ambiguous.status().message().find("org/m-GGUF:Q4_K_M"), std::string::npos);
}

TEST(HubCache, ListsAndRemoves) {
  TempDir dir;
  const std::string commit = fill_cache(dir.path(), false);
  fill_cache(dir.path(), true);
  write(dir.path() / "models--org--m" / "blobs" / "x.partial", "half");
  auto models = list_cached_models(dir.path());
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].repo, "org/m");
  EXPECT_EQ(models[0].commit, commit);
  EXPECT_EQ(models[0].refs, std::vector<std::string>{"main"});
  EXPECT_EQ(models[0].files, 3);
  EXPECT_EQ(models[0].bytes, 9u);  // "weights" + "{}", the partial not counted
  EXPECT_EQ(models[0].partial_files, 1);
  EXPECT_EQ(models[0].state, "unverified");  // config.json's blob is a git id, and no SHA256SUMS lists it
  EXPECT_EQ(models[1].state, "verified");    // every link ends in a SHA-256 blob
  const fs::path snap = dir.path() / "models--org--m" / "snapshots" / commit;
  write(snap / "SHA256SUMS", std::string(64, 'e') + "  config.json\n" + std::string(64, 'e') + "  sub/notes.json\n");
  EXPECT_EQ(list_cached_models(dir.path())[0].state, "verified");
  fs::remove(dir.path() / "models--org--m" / "blobs" / std::string(64, 'a'));
  EXPECT_EQ(list_cached_models(dir.path())[0].state, "broken");
  EXPECT_TRUE(remove_cached_model(dir.path(), "org/m").ok());
  EXPECT_EQ(list_cached_models(dir.path()).size(), 1u);
  EXPECT_EQ(remove_cached_model(dir.path(), "org/m").code(), StatusCode::kNotFound);
}

TEST(HubCache, RevisionsThatStayInTheCache) {
  for (const std::string& good : {std::string("main"), std::string("v1.0"), std::string("refs/pr/1"),
                                  std::string(40, 'a'), std::string("feature-x_y")}) {
    EXPECT_TRUE(check_revision(good).ok()) << good;
  }
  for (const char* bad : {"", "../../x", "..", ".", "/abs", "a//b", "a/", "a/./b", "a\\b", "main\n", "x\x7f"}) {
    const Status s = check_revision(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("revision"), std::string::npos) << bad;
  }
  EXPECT_FALSE(check_revision(std::string(257, 'a')).ok());
  TempDir dir;
  write(dir.path() / "x" / "models--org--m" / "snapshots" / std::string(40, 'c') / "f", "");
  EXPECT_FALSE(find_snapshot((dir.path() / "x").string(), "org/m", "../../x").has_value());
}

TEST(HubCache, Sha256Sums) {
  const std::string a(64, 'a'), b(64, 'B');
  const auto sums = parse_sha256sums(a + "  config.json\n" + b + " *sub/w.bin\r\nnot a line\n" + a.substr(1) +
                                     "  short.json\n" + a + "  \n" + a + "  config.json");
  EXPECT_EQ(sums.size(), 2u);
  EXPECT_EQ(sums.at("config.json"), a);
  EXPECT_EQ(sums.at("sub/w.bin"), std::string(64, 'b'));
}

// ---- the blob lock ----------------------------------------------------------------------------

TEST(BlobLock, ASecondHolderWaitsAndAnOrphanIsNotHeld) {
  TempDir dir;
  const std::string path = (dir.path() / "locks" / "x.lock").string();
  auto first = BlobLock::acquire(path, /*remove_when_done=*/true, nullptr, {});
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_TRUE(first->locked());
  std::atomic<bool> waited{false}, got{false};
  std::thread second([&] {
    auto lock = BlobLock::acquire(path, false, nullptr, [&] { waited = true; });
    ASSERT_TRUE(lock.ok());
    got = true;
    // The first holder deleted its file: this lock is on the file now at the path, not on the orphan.
    EXPECT_TRUE(fs::exists(path));
  });
  for (int i = 0; i < 100 && !waited; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(waited.load());
  EXPECT_FALSE(got.load());
  *first = BlobLock();  // released (and its file deleted)
  second.join();
  EXPECT_TRUE(got.load());
  // Cancelled while waiting.
  auto held = BlobLock::acquire(path, false, nullptr, {});
  ASSERT_TRUE(held.ok());
  std::atomic<bool> cancel{true};
  auto refused = BlobLock::acquire(path, false, &cancel, {});
  EXPECT_EQ(refused.status().code(), StatusCode::kCancelled);
}

// ---- HubClient against a misbehaving hub on loopback --------------------------------------------

// One thread accepting connections on 127.0.0.1; each is answered by `respond(request, fd)` and
// closed. `respond` may write for ever: send() fails once the client has gone or stop() was called.
class TinyHub {
 public:
  using Respond = std::function<void(const std::string& request, int fd)>;
  explicit TinyHub(Respond respond) : respond_(std::move(respond)) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listen_, 16), 0);
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~TinyHub() {
    stop_ = true;
    thread_.join();
    ::close(listen_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  int connections() const { return connections_.load(); }
  std::vector<std::string> requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }
  bool stopping() const { return stop_.load(); }

  // Whole writes; false once the client has gone (or the hub stops).
  static bool send_all(int fd, std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

 private:
  void serve() {
    std::vector<std::thread> workers;
    while (!stop_) {
      pollfd p{listen_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ++connections_;
      workers.emplace_back([this, fd] {
        std::string request;
        char buf[4096];
        while (request.find("\r\n\r\n") == std::string::npos) {
          const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
          if (n <= 0) break;
          request.append(buf, static_cast<std::size_t>(n));
        }
        {
          std::lock_guard lock(mu_);
          requests_.push_back(request);
        }
        respond_(request, fd);
        ::close(fd);
      });
    }
    for (std::thread& t : workers) t.join();
  }

  Respond respond_;
  int listen_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::mutex mu_;
  std::vector<std::string> requests_;
  std::thread thread_;
};

std::string sha256_of(std::string_view data) {
  Sha256 h;
  h.update({reinterpret_cast<const std::uint8_t*>(data.data()), data.size()});
  return h.finish_hex();
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

HubOptions quick(const std::string& endpoint) {
  HubOptions o;
  o.endpoint = endpoint;
  o.backoff_seconds = 0.01;
  o.stall_seconds = 5;
  return o;
}

// A file of `size` bytes as the hub lists it, and where a download puts it.
struct Fixture {
  TempDir dir;
  std::string data;
  RemoteFile file;
  DownloadTarget target;
  explicit Fixture(std::size_t size) {
    for (std::size_t i = 0; i < size; ++i) data += static_cast<char>('a' + (i * 7) % 26);
    file = RemoteFile{"w.bin", size, sha256_of(data), std::string(40, 'b')};
    target.final_path = (dir.path() / "blobs" / file.sha256).string();
    target.partial = target.final_path + ".partial";
    target.lock = (dir.path() / ".locks" / (file.sha256 + ".lock")).string();
  }
};

std::string ok_head(std::size_t length, std::string_view status = "200 OK") {
  return fmt::format("HTTP/1.1 {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", status, length);
}

TEST(HubClient, AFileSentPastItsListedSizeIsStoppedAtIt) {
  Fixture fx(1000);
  for (const bool announced : {false, true}) {
    TinyHub hub([&](const std::string&, int fd) {
      const std::string head = announced ? ok_head(fx.data.size() + (8 << 20))
                                         : std::string("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
      if (!TinyHub::send_all(fd, head + fx.data)) return;
      const std::string more(64 << 10, 'z');
      while (TinyHub::send_all(fd, more)) {
      }
    });
    const HubClient client(quick(hub.url()));
    const auto t0 = std::chrono::steady_clock::now();
    auto r = client.download("org/m", std::string(40, 'c'), fx.file, fx.target);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    const std::string& m = r.status().message();
    EXPECT_NE(m.find("w.bin"), std::string::npos) << m;
    EXPECT_NE(m.find("more than the 1000 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("the hub sent"), std::string::npos) << m;
    EXPECT_NE(m.find(announced ? "announced" : "no Content-Length"), std::string::npos) << m;
    EXPECT_EQ(hub.connections(), 1) << "retried";
    EXPECT_FALSE(fs::exists(fx.target.partial));
    EXPECT_FALSE(fs::exists(fx.target.final_path));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  }
}

TEST(HubClient, AWriteErrorIsFinalAndNamesTheFile) {
  Fixture fx(256 << 10);
  TinyHub hub([&](const std::string&, int fd) { TinyHub::send_all(fd, ok_head(fx.data.size()) + fx.data); });
  const HubClient client(quick(hub.url()));
  // A file size limit fails fwrite as a full disk does (EFBIG rather than ENOSPC), without root.
  rlimit old{};
  ::getrlimit(RLIMIT_FSIZE, &old);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto r = client.download("org/m", std::string(40, 'c'), fx.file, fx.target);
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
  EXPECT_NE(r.status().message().find(fx.target.partial), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(std::strerror(EFBIG)), std::string::npos) << r.status().message();
  EXPECT_EQ(hub.connections(), 1) << "retried";
  EXPECT_TRUE(fs::exists(fx.target.partial));  // kept for the next run
}

TEST(HubClient, RedirectsAreFollowedToHttpOnlyAndRefusedOnce) {
  EXPECT_EQ(allowed_protocols("https://huggingface.co"), "https");
  EXPECT_EQ(allowed_protocols("HTTPS://hf-mirror.com"), "https");
  EXPECT_EQ(allowed_protocols("http://127.0.0.1:8080"), "http,https");
  TinyHub ftp([](const std::string&, int fd) { TinyHub::send_all(fd, "220 ftp\r\n"); });
  Fixture fx(100);
  for (const std::string& location : {"ftp://127.0.0.1:" + std::to_string(ftp.port()) + "/w.bin",
                                     std::string("file:///etc/passwd"),
                                     "gopher://127.0.0.1:" + std::to_string(ftp.port()) + "/1"}) {
    TinyHub hub([&](const std::string&, int fd) {
      TinyHub::send_all(fd, "HTTP/1.1 302 Found\r\nLocation: " + location + "\r\nContent-Length: 0\r\n\r\n");
    });
    const HubClient client(quick(hub.url()));
    auto r = client.download("org/m", std::string(40, 'c'), fx.file, fx.target);
    ASSERT_FALSE(r.ok()) << location;
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().to_string();
    EXPECT_NE(r.status().message().find(location.substr(0, location.find(':') + 3)), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("does not follow"), std::string::npos) << r.status().message();
    EXPECT_EQ(hub.connections(), 1) << location << " retried";
    auto listed = client.list("org/m", "main");
    EXPECT_EQ(listed.status().code(), StatusCode::kFailedPrecondition) << listed.status().to_string();
    EXPECT_EQ(hub.connections(), 2) << location << " retried";
  }
  EXPECT_EQ(ftp.connections(), 0);
}

TEST(HubClient, AHubThatIgnoresRangeAndDropsAtOneByteIsNotRetriedForEver) {
  Fixture fx(256 << 10);
  TinyHub hub([&](const std::string&, int fd) {  // a 200 with everything, cut after 100 KiB
    TinyHub::send_all(fd, ok_head(fx.data.size()) + fx.data.substr(0, 100 << 10));
  });
  HubOptions o = quick(hub.url());
  o.max_attempts = 3;
  auto r = HubClient(o).download("org/m", std::string(40, 'c'), fx.file, fx.target);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().to_string();
  EXPECT_EQ(hub.connections(), 3);  // each brought 100 KiB from byte 0: the file no further than the first
}

TEST(HubClient, SmallRequestsAreBoundedBySizeAndTime) {
  const std::string head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n";
  const std::string item = R"({"rfilename": "f.bin", "size": 1},)";
  std::string chunk;
  while (chunk.size() < (64 << 10)) chunk += item;
  TinyHub endless([&](const std::string&, int fd) {
    if (!TinyHub::send_all(fd, head + R"({"sha": ")" + std::string(40, '0') + R"(", "siblings": [)")) return;
    while (TinyHub::send_all(fd, chunk)) {
    }
  });
  HubOptions o = quick(endless.url());
  o.max_listing_bytes = 1 << 20;
  o.max_text_bytes = 256 << 10;
  auto listed = HubClient(o).list("org/m", "main");
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kDataLoss) << listed.status().to_string();
  for (const std::string& word : {std::string("listing org/m"), endless.url(), std::string("1 MiB"),
                                  std::string("the hub sent")}) {
    EXPECT_NE(listed.status().message().find(word), std::string::npos) << listed.status().message();
  }
  auto text = HubClient(o).fetch_text("org/m", std::string(40, 'c'), "model.safetensors.index.json");
  EXPECT_EQ(text.status().code(), StatusCode::kDataLoss) << text.status().to_string();
  EXPECT_NE(text.status().message().find("256 KiB"), std::string::npos) << text.status().message();
  EXPECT_EQ(endless.connections(), 2);
  // A trickle never reaches the size: the deadline ends it.
  TinyHub trickle([&](const std::string&, int fd) {
    if (!TinyHub::send_all(fd, head + "{")) return;
    for (int i = 0; i < 400 && TinyHub::send_all(fd, " "); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  o = quick(trickle.url());
  o.request_timeout_seconds = 1;
  const auto t0 = std::chrono::steady_clock::now();
  listed = HubClient(o).list("org/m", "main");
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(listed.status().code(), StatusCode::kDeadlineExceeded) << listed.status().to_string();
  EXPECT_NE(listed.status().message().find("1 s"), std::string::npos) << listed.status().message();
  EXPECT_NE(listed.status().message().find("SEXTANT_HUB_TIMEOUT"), std::string::npos) << listed.status().message();
  EXPECT_LT(took, std::chrono::milliseconds(2500));
  EXPECT_EQ(trickle.connections(), 1);
}

TEST(HubClient, DeepListingsAreRefusedBeforeTheyAreParsed) {
  const std::string deep = R"({"sha": ")" + std::string(40, '0') + R"(", "siblings": )" + std::string(100000, '[') +
                           std::string(100000, ']') + "}";
  auto r = parse_repo_listing(HubSource::kHuggingFace, deep, "org/m", "main");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("the hub sent"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("levels deep"), std::string::npos) << r.status().message();
}

// Serves `data` as a file (Range ignored: always a 200 with everything), `rate` bytes a second.
TinyHub::Respond file_server(const std::string& data, std::size_t rate) {
  return [&data, rate](const std::string&, int fd) {
    if (!TinyHub::send_all(fd, ok_head(data.size()))) return;
    for (std::size_t at = 0; at < data.size(); at += rate / 50) {
      if (!TinyHub::send_all(fd, std::string_view(data).substr(at, rate / 50))) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
}

TEST(HubClient, TwoDownloadsOfOneFileTakeTurnsAndTheFileOnDiskDecides) {
  Fixture fx(200 << 10);
  TinyHub hub(file_server(fx.data, 400 << 10));
  HubOptions o = quick(hub.url());
  std::atomic<int> waits{0};
  o.note = [&](const std::string& s) {
    if (s.find("waiting") != std::string::npos) ++waits;
  };
  const HubClient client(o);
  // Half a file left by an interrupted run, so each download would start with a Range.
  fs::create_directories(fs::path(fx.target.partial).parent_path());
  std::ofstream(fx.target.partial, std::ios::binary) << fx.data.substr(0, fx.data.size() / 2);
  Result<DownloadStats> a = internal_error("not run"), b = internal_error("not run");
  std::thread first([&] { a = client.download("org/m", std::string(40, 'c'), fx.file, fx.target); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::thread second([&] { b = client.download("org/m", std::string(40, 'c'), fx.file, fx.target); });
  first.join();
  second.join();
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(waits.load(), 1);
  EXPECT_EQ(hub.connections(), 1);
  EXPECT_TRUE(a->reused != b->reused);
  EXPECT_EQ(read_all(fx.target.final_path), fx.data);
  EXPECT_EQ(a->sha256, fx.file.sha256);
  EXPECT_EQ(b->sha256, fx.file.sha256);
  // A file with the final name whose bytes are not the file's (a hole of zeros): fetched again.
  std::string holed = fx.data;
  std::fill(holed.begin() + 1000, holed.begin() + 5000, '\0');
  std::ofstream(fx.target.final_path, std::ios::binary | std::ios::trunc) << holed;
  auto again = client.download("org/m", std::string(40, 'c'), fx.file, fx.target);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_FALSE(again->reused);
  EXPECT_EQ(read_all(fx.target.final_path), fx.data);
  EXPECT_EQ(hub.connections(), 2);
}

TEST(Pull, Globs) {
  EXPECT_TRUE(glob_match("*.json", "config.json"));
  EXPECT_FALSE(glob_match("*.json", "sub/config.json"));
  EXPECT_TRUE(glob_match("**.json", "sub/config.json"));
  EXPECT_TRUE(glob_match("model-0000?-of-*.safetensors", "model-00001-of-00004.safetensors"));
  EXPECT_FALSE(glob_match("model-0000?-of-*.safetensors", "model-0001-of-00004.safetensors"));
  EXPECT_TRUE(glob_match("Q4_K_M/*", "Q4_K_M/a.gguf"));
  EXPECT_FALSE(glob_match("", "a"));
}

RepoListing listing(const std::vector<std::string>& paths) {
  RepoListing l;
  l.commit = std::string(40, 'c');
  for (const std::string& p : paths) l.files.push_back(RemoteFile{p, 10, p.ends_with(".json") ? "" : std::string(64, 'a'), std::string(40, 'b')});
  return l;
}

std::vector<std::string> paths(const std::vector<RemoteFile>& files) {
  std::vector<std::string> out;
  for (const RemoteFile& f : files) out.push_back(f.path);
  return out;
}

TEST(Pull, SelectsTheModelsFiles) {
  const std::string index = R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                "b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}})";
  int index_reads = 0;
  auto read_index = [&]() -> Result<std::string> {
    ++index_reads;
    return index;
  };
  const RepoListing st = listing({".gitattributes", "README.md", "config.json", "generation_config.json",
                                  "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                  "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                                  "merges.txt", "vocab.json", "original/consolidated.pth"});
  auto chosen = select_files(st, parse_model_ref("org/m").value(), {}, read_index);
  ASSERT_TRUE(chosen.ok()) << chosen.status().to_string();
  EXPECT_EQ(paths(*chosen), (std::vector<std::string>{"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                                                      "model-00002-of-00002.safetensors", "config.json",
                                                      "generation_config.json", "tokenizer.json",
                                                      "tokenizer_config.json", "vocab.json", "merges.txt"}));
  EXPECT_EQ(index_reads, 1);
  // The index names a shard the repository lacks: refused, naming it.
  RepoListing lacking = st;
  std::erase_if(lacking.files, [](const RemoteFile& f) { return f.path == "model-00002-of-00002.safetensors"; });
  auto refused = select_files(lacking, parse_model_ref("org/m").value(), {}, read_index);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kNotFound);
  EXPECT_NE(refused.status().message().find("model-00002-of-00002.safetensors"), std::string::npos);
  // --include wins.
  auto included = select_files(st, parse_model_ref("org/m").value(), {"*.json"}, read_index);
  ASSERT_TRUE(included.ok());
  EXPECT_EQ(included->size(), 6u);  // the six .json files
  EXPECT_FALSE(select_files(st, parse_model_ref("org/m").value(), {"*.gguf"}, read_index).ok());
}

TEST(Pull, SelectsAQuantisation) {
  const RepoListing g = listing({"README.md", "m-Q8_0.gguf", "m-F16.gguf", "m-Q4_K_M.gguf",
                                 "m-Q4_0-00001-of-00003.gguf", "m-Q4_0-00002-of-00003.gguf",
                                 "m-Q4_0-00003-of-00003.gguf", "m-Q2_K-00001-of-00002.gguf"});
  auto none = [&]() -> Result<std::string> { return not_found_error("no index"); };
  auto q8 = select_files(g, parse_model_ref("org/m-GGUF:Q8_0").value(), {}, none);
  ASSERT_TRUE(q8.ok());
  EXPECT_EQ(paths(*q8), std::vector<std::string>{"m-Q8_0.gguf"});
  auto split = select_files(g, parse_model_ref("org/m-GGUF:Q4_0").value(), {}, none);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(paths(*split), (std::vector<std::string>{"m-Q4_0-00001-of-00003.gguf", "m-Q4_0-00002-of-00003.gguf",
                                                     "m-Q4_0-00003-of-00003.gguf"}));
  auto incomplete = select_files(g, parse_model_ref("org/m-GGUF:Q2_K").value(), {}, none);
  ASSERT_FALSE(incomplete.ok());
  EXPECT_NE(incomplete.status().message().find("m-Q2_K-00002-of-00002.gguf"), std::string::npos);
  auto absent = select_files(g, parse_model_ref("org/m-GGUF:Q6_K").value(), {}, none);
  ASSERT_FALSE(absent.ok());
  EXPECT_NE(absent.status().message().find("m-Q4_K_M.gguf"), std::string::npos);
  auto unnamed = select_files(g, parse_model_ref("org/m-GGUF").value(), {}, none);
  ASSERT_FALSE(unnamed.ok());
  EXPECT_NE(unnamed.status().message().find("org/m-GGUF:Q4_K_M"), std::string::npos);
  auto one = select_files(listing({"README.md", "m-Q8_0.gguf"}), parse_model_ref("org/m-GGUF").value(), {}, none);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(paths(*one), std::vector<std::string>{"m-Q8_0.gguf"});
  EXPECT_FALSE(select_files(listing({"README.md"}), parse_model_ref("org/m").value(), {}, none).ok());
}

}  // namespace
}  // namespace sx::hub
