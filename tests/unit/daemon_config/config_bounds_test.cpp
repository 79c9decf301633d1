// daemon/config reading bounds: a config path that is not a regular file (a FIFO, a device) is
// refused without blocking, a file or string over the size limit is refused before it is parsed,
// the error list keeps the first problems and counts the rest, and deep nesting is refused by name.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <string>

#include <gtest/gtest.h>

#include "daemon/config/fields.h"
#include "daemon/config/yaml_io.h"

namespace sx::daemon::config {
namespace {

// The documented limits (yaml_io.h, fields.h), restated so that a change to them is a decision.
constexpr std::uint64_t kMaxConfigBytes = 1u << 20;
constexpr size_t kMaxErrorLines = 20;
constexpr int kMaxConfigNesting = 64;
static_assert(kMaxConfigBytes == config::kMaxConfigBytes && kMaxErrorLines == config::kMaxErrorLines &&
              kMaxConfigNesting == config::kMaxConfigNesting);

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/sx_config_bounds_XXXXXX";
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

size_t count_lines(const std::string& text) {
  size_t n = 1;
  for (char ch : text) n += ch == '\n';
  return n;
}

TEST(ConfigBounds, FifoAsConfigIsRefusedWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.file("sextant.yaml");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto future = std::async(std::launch::async, [&] { return load_config_file(fifo); });
  if (future.wait_for(std::chrono::seconds(5)) == std::future_status::timeout) {
    ADD_FAILURE() << "load_config_file still blocked on the FIFO after 5 s";
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // unblocks the reader (EOF)
    if (w >= 0) ::close(w);
  }
  auto r = future.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "cannot read config file '" + fifo + "': not a regular file (a FIFO)");
}

TEST(ConfigBounds, DeviceAsConfigIsRefused) {
  auto r = load_config_file("/dev/null");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "cannot read config file '/dev/null': not a regular file (a character device)");
}

TEST(ConfigBounds, FileOverTheSizeLimitIsRefusedWithItsSize) {
  TempDir dir;
  const std::string path = dir.file("big.yaml");
  {
    std::ofstream out(path);
    out << "# " << std::string(kMaxConfigBytes, 'x') << "\n";  // a valid (all-comment) config
  }
  const std::uint64_t size = kMaxConfigBytes + 3;
  auto r = load_config_file(path);
  ASSERT_FALSE(r.ok()) << "a " << size << "-byte config was read";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "cannot read config file '" + path + "': " + std::to_string(size) +
                                      " bytes, more than the limit of " + std::to_string(kMaxConfigBytes) +
                                      " bytes");
  // At the limit it is read.
  {
    std::ofstream out(path);
    out << "#" << std::string(kMaxConfigBytes - 2, 'x') << "\n";
  }
  auto at_limit = load_config_file(path);
  EXPECT_TRUE(at_limit.ok()) << at_limit.status().to_string();
}

TEST(ConfigBounds, StringOverTheSizeLimitIsRefused) {
  const std::string text = "# " + std::string(kMaxConfigBytes, 'x') + "\n";
  auto r = load_config_string(text, "big.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "big.yaml: " + std::to_string(text.size()) +
                                      " bytes, more than the limit of " + std::to_string(kMaxConfigBytes) +
                                      " bytes for a config");
}

TEST(ConfigBounds, ManyProblemsKeepTheFirstAndCountTheRest) {
  std::string text = "engine:\n";
  constexpr int kKeys = 50000;
  for (int i = 0; i < kKeys; ++i) text += "  k" + std::to_string(i) + ": 1\n";  // 600 KB
  auto r = load_config_string(text, "many.yaml");
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_EQ(count_lines(m), kMaxErrorLines + 1) << m.substr(0, 2000);
  EXPECT_EQ(m.rfind("many.yaml:2:3: engine.k0: unknown key", 0), 0u) << m.substr(0, 200);
  const std::string last = "many.yaml: ... and " + std::to_string(kKeys - kMaxErrorLines) + " more problems";
  EXPECT_TRUE(m.ends_with("\n" + last)) << m.substr(m.size() > 300 ? m.size() - 300 : 0);
}

TEST(ConfigBounds, ErrorListCapSurvivesAppend) {
  ErrorList a, b;
  for (size_t i = 0; i < kMaxErrorLines - 1; ++i) a.add("a", "", "problem");
  for (int i = 0; i < 5; ++i) b.add("b", "", "problem");
  a.append(b);
  const std::string m = a.to_status().message();
  EXPECT_EQ(count_lines(m), kMaxErrorLines + 1) << m;
  EXPECT_TRUE(m.ends_with("\nb: problem\n... and 4 more problems")) << m;
  ErrorList one;
  for (size_t i = 0; i < kMaxErrorLines + 1; ++i) one.add("x", "", "p");
  EXPECT_TRUE(one.to_status().message().ends_with("\n... and 1 more problem")) << one.to_status().message();
}

// The first line of a nesting error, which must name the source and the limit.
void expect_nesting_refused(const std::string& text, const std::string& what) {
  SCOPED_TRACE(what);
  auto r = load_config_string(text, "deep.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_EQ(m.rfind("deep.yaml:", 0), 0u) << m;
  EXPECT_NE(m.find("nested more than " + std::to_string(kMaxConfigNesting) + " levels deep"), std::string::npos)
      << m;
}

TEST(ConfigBounds, DeepNestingIsRefusedBeforeYamlCpp) {
  expect_nesting_refused(std::string(100000, '['), "100k flow sequences");
  expect_nesting_refused(std::string(100000, '{'), "100k flow maps");
  expect_nesting_refused("model:\n  devices: " + std::string(500000, '[') + std::string(500000, ']') + "\n",
                         "balanced, 500k deep");
  std::string dashes;
  for (int i = 0; i < 100000; ++i) dashes += "- ";
  expect_nesting_refused(dashes + "x\n", "100k compact block sequences");
  std::string maps;
  for (int i = 0; i < 1000; ++i) maps += std::string(static_cast<size_t>(i), ' ') + "k:\n";
  expect_nesting_refused(maps, "1000 indented maps");
}

TEST(ConfigBounds, NestingScanIgnoresQuotesCommentsAndBlockScalars) {
  const std::string brackets(200, '[');
  ServeConfig c;
  auto r = load_config_string("# " + brackets + "\nmodel:\n  path: \"" + brackets + "\"  # " + brackets +
                                  "\n  served_model_name: '" + brackets + "'\n",
                              "ok.yaml");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->model.path, brackets);
  EXPECT_EQ(r->model.served_model_name, brackets);
  auto block = load_config_string("model:\n  path: |\n    " + brackets + "\n    - - - - - - - -\n", "ok.yaml");
  ASSERT_TRUE(block.ok()) << block.status().to_string();
  EXPECT_EQ(block->model.path, brackets + "\n- - - - - - - -\n");
  auto plain = load_config_string("model:\n  path: a[b{c\n  devices: [[0], 1]\n", "ok.yaml");
  ASSERT_FALSE(plain.ok());  // [0] is not a single value, but the nesting is fine
  EXPECT_EQ(plain.status().message().find("nested more than"), std::string::npos) << plain.status().message();
}

// Fuzz findings (tests/fuzz/regressions/config_yaml): yaml-cpp 0.7's LoadAll adds empty documents
// forever after a ',' at the top level and a few other tokens (jbeder/yaml-cpp#1040); documents are
// counted first, and one that starts where the previous one did is a syntax error there.
TEST(ConfigBounds, InputYamlCppLoopsOnIsASyntaxError) {
  for (const std::string text : {",", "[a],", "'a' ,", "\"a\",", "{a: 1} ,", "--- ,", "---\n,", "... ,", "&x ,", "!t ,",
                                 "\xEF\xBB\xBF,", "\xEF\xBB\xBF[a],", "&\",", "!,", "!!i,", "!<a,b>,",
                                 "\"x\":\"1\n? "}) {
    SCOPED_TRACE(text);
    auto r = load_config_string(text, "comma.yaml");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(": YAML syntax error: unexpected '"), std::string::npos)
        << r.status().message();
    EXPECT_EQ(r.status().message().rfind("comma.yaml:", 0), 0u) << r.status().message();
  }
  // Where yaml-cpp reports its own error, that error stays.
  EXPECT_EQ(load_config_string("model: 1\n,", "comma.yaml").status().message(),
            "comma.yaml:2:1: YAML syntax error: end of map not found");
  // Commas where YAML allows them are not refused.
  auto ok = load_config_string("model:\n  path: a,b , c\n  served_model_name: x\n    ,y\n  devices: [0, 1]\n",
                               "comma.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->model.path, "a,b , c");
  EXPECT_EQ(ok->model.served_model_name, "x ,y");
}

TEST(ConfigBounds, ControlBytesInKeysAndParserMessagesStayOnOneLine) {
  auto key = load_config_string("\"model\\npath\": 1\n", "ctl.yaml");
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.status().message().find('\n'), std::string::npos) << key.status().message();
  EXPECT_EQ(key.status().message().rfind("ctl.yaml:1:1: model\\x0Apath: unknown section", 0), 0u)
      << key.status().message();
  auto nested = load_config_string("engine:\n  \"max\\tseqs\": 1\n", "ctl.yaml");
  ASSERT_FALSE(nested.ok());
  EXPECT_EQ(nested.status().message().rfind("ctl.yaml:2:3: engine.max\\x09seqs: unknown key", 0), 0u)
      << nested.status().message();
  // Raw control bytes are not YAML (yaml-cpp quoted them raw in its message, and loops on "\0,").
  for (const std::string raw : {std::string("e\x01\0\n", 4), std::string("\0,", 2), std::string("a: \"\x7f\"\n")}) {
    auto message = load_config_string(raw, "ctl.yaml");
    ASSERT_FALSE(message.ok());
    for (char ch : message.status().message()) EXPECT_GE(static_cast<unsigned char>(ch), 0x20) << message.status().message();
    EXPECT_NE(message.status().message().find("YAML syntax error: control character 0x"), std::string::npos)
        << message.status().message();
  }
  EXPECT_EQ(load_config_string(std::string("\0,", 2), "ctl.yaml").status().message(),
            "ctl.yaml:1:1: YAML syntax error: control character 0x00 (YAML allows none but tab, line feed and "
            "carriage return; write it as \\x00 in a double-quoted string)");
  // Tabs and CRLF line ends are fine, and so is the escape written as text.
  auto ok = load_config_string("model:\r\n  path: \"a\\x01b\"\t# tab\r\n", "ctl.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->model.path, std::string("a\x01") + "b");
}

}  // namespace
}  // namespace sx::daemon::config
