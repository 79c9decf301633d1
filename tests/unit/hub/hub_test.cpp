// runtime/hub: model references, quantisation names and split parts, the Hugging Face cache layout
// (snapshots through refs, what serve loads from one, `ls`, `rm`), globs and the choice of files.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/hub/hub_cache.h"
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
