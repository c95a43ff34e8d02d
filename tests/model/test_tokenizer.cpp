// Tokenizers and token sources (sim/model/tokenizer.h, load_tokens): the fixtures'
// byte scheme, BPE from small hand-written tokenizer.json files whose expected ids
// follow from the pipeline's rules (GPT-2's pre-tokenization pattern and merge ranks,
// SentencePiece-style byte fallback and unk, added tokens), and token id files. The
// pipelines of real models against tokenizers' own ids: test_tokenizer_references.cpp.
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "io_test_files.h"
#include "sim/io/input_file.h"
#include "sim/io/tensor_writer.h"
#include "sim/model/model_eval.h"
#include "sim/model/tokenizer.h"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;

namespace {

// GPT-2's byte alphabet, written out from its definition: printable Latin-1 bytes
// ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves, the other bytes, in order,
// for U+0100, U+0101, ...
std::string byte_symbol(int b) {
  int next = 256;
  for (int c = 0; c < 256; ++c) {
    const bool printable = (c >= 33 && c <= 126) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    const int cp = printable ? c : next++;
    if (c == b) {
      std::string s;
      if (cp < 0x80) s += static_cast<char>(cp);
      else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      return s;
    }
  }
  return "";
}

// Vocabulary: the 256 byte symbols (id = byte value), then the merge results in rank
// order (ids 256, 257, ...), then "<|endoftext|>".
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"Ġ", "t"}, {"h", "e"},    {"Ġt", "he"},   {"l", "l"},     {"e", "ll"}, {"H", "ell"}, {"Hell", "o"}, {"o", "r"},
    {"Ġ", "w"}, {"Ġw", "or"},  {"Ġwor", "l"},  {"Ġworl", "d"}, {"'", "s"},  {"4", "2"},   {"Ġ", "42"},   {"!", "!"},
    {"f", "Ã"}};

fs::path write_tokenizer(const fs::path& dir, bool pair_merges, bool prefix_space) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  nlohmann::json merges = nlohmann::json::array();
  int id = 256;
  for (const auto& [l, r] : kMerges) {
    vocab[l + r] = id++;
    if (pair_merges) merges.push_back({l, r});
    else merges.push_back(l + " " + r);
  }
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens", {{{"id", id}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", prefix_space}, {"trim_offsets", true}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", merges}}}};
  const fs::path p = dir / (std::string(pair_merges ? "pairs" : "strings") + (prefix_space ? "_prefix" : "") + ".json");
  std::ofstream(p) << j.dump();
  return p;
}

int64_t id_of(const BpeTokenizer& t, const std::string& token) {
  const auto id = t.token_id(token);
  REQUIRE_MESSAGE(id.has_value(), "no token " << token);
  return *id;
}

std::vector<int64_t> bytes_of(const std::string& s) {
  std::vector<int64_t> v;
  for (char c : s) v.push_back(static_cast<unsigned char>(c));
  return v;
}

}  // namespace

TEST_CASE("byte tokenizer: BOS then the bytes; decoding skips non-byte ids") {
  const ByteTokenizer t(256);
  CHECK(t.encode("Hi\n\xC3\xA9") == std::vector<int64_t>{256, 72, 105, 10, 0xC3, 0xA9});
  CHECK(t.decode({256, 72, 105}) == "Hi");
  CHECK(ByteTokenizer(std::nullopt).encode("A") == std::vector<int64_t>{65});
}

TEST_CASE("GPT-2 BPE: pre-tokenization pieces, merges by rank, added tokens, round trip") {
  const fs::path dir = scratch_dir("bpe");
  for (bool pairs : {false, true}) {
    CAPTURE(pairs);
    const auto tok = BpeTokenizer::load(write_tokenizer(dir, pairs, false));
    CHECK(tok->vocab_size() == 256 + static_cast<int64_t>(kMerges.size()) + 1);
    // Pieces: "Hello" " the" " world" "'s" " 42" "!!" "  \n" "\n" "x" (the last space
    // of a run before a non-space goes to \s+ on its own when it is not ' ').
    const std::string text = "Hello the world's 42!!  \n\nx";
    std::vector<int64_t> want = {id_of(*tok, "Hello"), id_of(*tok, "Ġthe"), id_of(*tok, "Ġworld"), id_of(*tok, "'s"),
                                 id_of(*tok, "Ġ42"),   id_of(*tok, "!!"),   ' ',                    ' ',
                                 '\n',                 '\n',                'x'};
    CHECK(tok->encode(text) == want);
    CHECK(tok->decode(tok->encode(text)) == text);
    // A space run before a word: all but the last space form one piece, the last
    // joins the word (" the" merges); a merge never crosses pieces ("t" "he" stay
    // apart in "xthe" because "Ġt" needs the space).
    CHECK(tok->encode("a   the") == std::vector<int64_t>{'a', ' ', ' ', id_of(*tok, "Ġthe")});
    CHECK(tok->encode("xthe") == std::vector<int64_t>{'x', 't', id_of(*tok, "he")});
    // Letters beyond ASCII stay in their word: "f" + the first byte of "é" merges.
    CHECK(tok->encode(" caf\xC3\xA9") == std::vector<int64_t>{' ', 'c', 'a', id_of(*tok, "fÃ"), 0xA9});
    CHECK(tok->decode(tok->encode("na\xC3\xAFve caf\xC3\xA9")) == "na\xC3\xAFve caf\xC3\xA9");
    // Numbers and symbols are their own pieces; contractions split off.
    CHECK(tok->encode("x42") == std::vector<int64_t>{'x', id_of(*tok, "42")});
    CHECK(tok->encode("it's") == std::vector<int64_t>{'i', 't', id_of(*tok, "'s")});
    // Added tokens are matched literally before anything else.
    const int64_t eot = id_of(*tok, "<|endoftext|>");
    CHECK(tok->encode("x<|endoftext|> the") == std::vector<int64_t>{'x', eot, id_of(*tok, "Ġthe")});
    CHECK(tok->decode({'x', eot}) == "x<|endoftext|>");
    // Bytes that are not UTF-8 decode as U+FFFD, one per maximal ill-formed run (as
    // Rust's from_utf8_lossy in tokenizers' ByteLevel decoder).
    CHECK(tok->decode({'x', 0xC3}) == "x\xEF\xBF\xBD");
    CHECK(tok->decode({0xE2, 0x82, 'x', 0xFF}) == "\xEF\xBF\xBDx\xEF\xBF\xBD");
  }
  const auto prefixed = BpeTokenizer::load(write_tokenizer(dir, false, true));
  CHECK(prefixed->encode("the") == std::vector<int64_t>{id_of(*prefixed, "Ġthe")});
}

TEST_CASE("BPE: what is not supported is a named error") {
  const fs::path dir = scratch_dir("bpe_errors");
  const fs::path good = write_tokenizer(dir, false, false);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(good));
  auto write = [&](const std::string& name, const nlohmann::json& v) {
    std::ofstream(dir / name) << v.dump();
    return error_of([&] { BpeTokenizer::load(dir / name); });
  };
  nlohmann::json wp = j;
  wp["model"]["type"] = "WordPiece";
  CHECK(has(write("wp.json", wp), "wp.json: key 'model.type': 'WordPiece' is not supported"));
  nlohmann::json norm = j;
  norm["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKC"}}}}};
  CHECK(has(write("norm.json", norm), "norm.json: key 'normalizer.normalizers[1].type': 'NFKC' is not supported"));
  nlohmann::json regex_replace = j;
  regex_replace["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", " "}};
  CHECK(has(write("regex_replace.json", regex_replace), "key 'normalizer.pattern': only a string pattern"));
  nlohmann::json pre = j;
  pre["pre_tokenizer"] = {{"type", "Whitespace"}};
  CHECK(has(write("pre.json", pre), "key 'pre_tokenizer.type': 'Whitespace' is not supported"));
  nlohmann::json pattern = j;
  pattern["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers",
                               {{{"type", "Split"}, {"pattern", {{"Regex", "\\w+|\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}},
                                {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  CHECK(has(write("pattern.json", pattern),
            "key 'pre_tokenizer.pretokenizers[0].pattern.Regex': the pattern '\\w+|\\s+' is not one of the supported ones"));
  nlohmann::json removed = pattern;
  removed["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  removed["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  CHECK(has(write("removed.json", removed), "key 'pre_tokenizer.pretokenizers[0].behavior': 'Removed' is not supported"));
  nlohmann::json dropout = j;
  dropout["model"]["dropout"] = 0.1;
  CHECK(has(write("dropout.json", dropout), "key 'model.dropout': BPE dropout (0.1) is not supported"));
  nlohmann::json prefix = j;
  prefix["model"]["continuing_subword_prefix"] = "##";
  CHECK(has(write("prefix.json", prefix), "key 'model.continuing_subword_prefix': is not supported"));
  nlohmann::json single = j;
  single["added_tokens"][0]["single_word"] = true;
  CHECK(has(write("single.json", single), "key 'added_tokens[0].single_word': true is not supported"));
  nlohmann::json post = j;
  post["post_processor"] = {{"type", "RobertaProcessing"}};
  CHECK(has(write("post.json", post), "key 'post_processor.type': 'RobertaProcessing' is not supported"));
  nlohmann::json dec = j;
  dec["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "Fuse"}}, {{"type", "WordPiece"}}}}};
  CHECK(has(write("dec.json", dec), "key 'decoder.decoders[1].type': 'WordPiece' is not supported"));
  nlohmann::json trunc = j;
  trunc["truncation"] = {{"max_length", 8}};
  CHECK(has(write("trunc.json", trunc), "key 'truncation': is not supported"));
  nlohmann::json missing_merge = j;
  missing_merge["model"]["merges"].push_back("q z");
  CHECK(has(write("missing_merge.json", missing_merge), "key 'model.merges': entry 17 (q z): 'qz' is not in model.vocab"));
  nlohmann::json merge = j;
  merge["model"]["merges"][3] = "nospace";
  CHECK(has(write("merge.json", merge), "key 'model.merges': entry 3 'nospace'"));
  std::ofstream(dir / "broken.json") << "{\"model\": ";
  CHECK(has(error_of([&] { BpeTokenizer::load(dir / "broken.json"); }), "broken.json: malformed JSON"));
  const auto tok = BpeTokenizer::load(good);
  CHECK(has(error_of([&] { tok->decode({99999}); }), "token id 99999 is not in the vocabulary"));
  // A vocabulary without some byte cannot encode it.
  nlohmann::json holes = j;
  holes["model"]["vocab"].erase(byte_symbol('z'));
  std::ofstream(dir / "holes.json") << holes.dump();
  const auto holey = BpeTokenizer::load(dir / "holes.json");
  CHECK(has(error_of([&] { holey->encode("z"); }), "the vocabulary has no token 'z'"));
}

namespace {

// A SentencePiece-style BPE (symbols are code points, "▁" for spaces) over the letters
// of "hello world", with byte fallback tokens for the bytes of "é" only.
nlohmann::json spm_style(bool byte_fallback, bool with_unk, bool fuse_unk) {
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"\xE2\x96\x81", 3}, {"h", 4}, {"e", 5}, {"l", 6},
                          {"o", 7},     {"w", 8},   {"r", 9},    {"d", 10},           {"he", 11}, {"ll", 12}, {"hell", 13},
                          {"hello", 14}, {"\xE2\x96\x81w", 15}, {"<0xC3>", 16}, {"<0xA9>", 17}};
  return {{"added_tokens",
           {{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
            {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
            {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}}},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
          {"pre_tokenizer", nullptr},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"},
            {"unk_token", with_unk ? nlohmann::json("<unk>") : nlohmann::json()},
            {"fuse_unk", fuse_unk},
            {"byte_fallback", byte_fallback},
            {"vocab", vocab},
            {"merges", {"h e", "l l", "he ll", "hell o", "\xE2\x96\x81 w"}}}}};
}

}  // namespace

TEST_CASE("SentencePiece-style BPE: code points, byte fallback, unk and fuse_unk, the template, the decoder") {
  const fs::path dir = scratch_dir("spm_style");
  auto load = [&](const std::string& name, const nlohmann::json& j) {
    std::ofstream(dir / name) << j.dump();
    return BpeTokenizer::load(dir / name);
  };
  const auto tok = load("fallback.json", spm_style(true, true, true));
  // "hello world" -> "▁hello▁world" (Prepend, Replace), one piece: "▁" "hello" "▁w" "o" "r" "l" "d".
  const std::vector<int64_t> hello = {3, 14, 15, 7, 9, 6, 10};
  CHECK(tok->encode("hello world") == hello);
  std::vector<int64_t> with_bos = hello;
  with_bos.insert(with_bos.begin(), 1);
  CHECK(tok->encode_with_special_tokens("hello world") == with_bos);
  CHECK(tok->template_prefix() == std::vector<int64_t>{1});
  CHECK(tok->decode(hello) == "hello world");  // "▁" -> " ", the first space stripped
  // "é" is not in the vocabulary: its bytes; "ü" has no byte tokens: <unk>, fused with
  // the next unknown "ß" (both pending until a known character).
  CHECK(tok->encode("e\xC3\xA9") == std::vector<int64_t>{3, 5, 16, 17});
  CHECK(tok->decode({3, 5, 16, 17}) == "e\xC3\xA9");
  CHECK(tok->encode("\xC3\xBC\xC3\x9Fo") == std::vector<int64_t>{3, 0, 7});
  CHECK(load("nofuse.json", spm_style(true, true, false))->encode("\xC3\xBC\xC3\x9Fo") == std::vector<int64_t>{3, 0, 0, 7});
  // A lone byte token that is not UTF-8 decodes as U+FFFD; added tokens keep their text.
  CHECK(tok->decode({16, 7}) == "\xEF\xBF\xBDo");
  CHECK(tok->decode({1, 14, 2}) == "<s>hello</s>");
  // Added tokens split the text before normalization: each part gets its own "▁".
  CHECK(tok->encode("hello</s>hello") == std::vector<int64_t>{3, 14, 2, 3, 14});
  // Without unk_token, an unknown character is an error (tokenizers would drop it).
  const auto strict = load("strict.json", spm_style(false, false, false));
  CHECK(has(error_of([&] { strict->encode("caf\xC3\xA9"); }), "the vocabulary has no token"));
  nlohmann::json bad_unk = spm_style(false, true, false);
  bad_unk["model"]["unk_token"] = "<missing>";
  CHECK(has(error_of([&] { load("bad_unk.json", bad_unk)->encode("\xC3\xA9"); }), "model.unk_token '<missing>' is not in model.vocab"));
  // No pre-tokenizer: no stable cut.
  CHECK(tok->stable_prefix_length("hello world hello world") == 0);
  // Metaspace's decoder: "▁" is a space, dropped in the first token (prepend_scheme always).
  nlohmann::json meta = spm_style(true, true, true);
  meta["decoder"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}, {"split", true}};
  CHECK(load("meta.json", meta)->decode({3, 14, 15, 7}) == "hello wo");
}

TEST_CASE("BPE: merges apply lowest rank first, then leftmost, as tokenizers' word.rs") {
  const fs::path dir = scratch_dir("bpe_merge_order");
  // "aab": the leftmost "a a" (rank 0) merges first, and "a b" (rank 3) no longer
  // applies; "aaaa": "a a" twice, then "aa aa" (rank 2). "ba" is a token no merge makes.
  const nlohmann::json j = {
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", {{"a", 0}, {"b", 1}, {"aa", 2}, {"aaa", 3}, {"aaaa", 4}, {"ab", 5}, {"ba", 6}}},
        {"merges", {"a a", "aa a", "aa aa", "a b"}}}}};
  std::ofstream(dir / "t.json") << j.dump();
  const auto tok = BpeTokenizer::load(dir / "t.json");
  CHECK(tok->encode("aa") == std::vector<int64_t>{2});
  CHECK(tok->encode("aaa") == std::vector<int64_t>{3});
  CHECK(tok->encode("aaaa") == std::vector<int64_t>{4});
  CHECK(tok->encode("aab") == std::vector<int64_t>{2, 1});
  CHECK(tok->encode("ab") == std::vector<int64_t>{5});
  CHECK(tok->encode("ba") == std::vector<int64_t>{1, 0});
  // ignore_merges: a piece that is a token is that token, merges or not.
  nlohmann::json ignore = j;
  ignore["model"]["ignore_merges"] = true;
  std::ofstream(dir / "ignore.json") << ignore.dump();
  CHECK(BpeTokenizer::load(dir / "ignore.json")->encode("ba") == std::vector<int64_t>{6});
}

TEST_CASE("BPE: added tokens with lstrip / rstrip take the whitespace around them; normalized ones match after normalization") {
  const fs::path dir = scratch_dir("bpe_added_strip");
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  const nlohmann::json j = {
      {"added_tokens",
       {{{"id", 256}, {"content", "<mask>"}, {"lstrip", true}, {"rstrip", true}, {"normalized", false}, {"special", true}},
        {{"id", 257}, {"content", "caf\xC3\xA9"}, {"normalized", true}, {"special", false}}}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  std::ofstream(dir / "t.json") << j.dump();
  const auto tok = BpeTokenizer::load(dir / "t.json");
  CHECK(tok->encode("a  <mask>\t b") == std::vector<int64_t>{'a', 256, 'b'});
  // "cafe" + U+0301 is "café" after NFC: the normalized added token matches it.
  CHECK(tok->encode("x caf" "e\xCC\x81") == std::vector<int64_t>{'x', ' ', 257});
  CHECK(tok->encode("x caf\xC3\xA9") == std::vector<int64_t>{'x', ' ', 257});
}

TEST_CASE("BPE: ByteLevel's add_prefix_space applies to every part between added tokens, as tokenizers") {
  const fs::path dir = scratch_dir("bpe_prefix_parts");
  const auto prefixed = BpeTokenizer::load(write_tokenizer(dir, false, true));
  const int64_t eot = id_of(*prefixed, "<|endoftext|>");
  CHECK(prefixed->encode("the<|endoftext|>the") == std::vector<int64_t>{id_of(*prefixed, "Ġthe"), eot, id_of(*prefixed, "Ġthe")});
}

TEST_CASE("token id files: whitespace-separated text and .npy") {
  const fs::path dir = scratch_dir("token_files");
  std::ofstream(dir / "ids.txt") << "256 72\n105\t10  \n";
  CHECK(read_token_ids(dir / "ids.txt") == std::vector<int64_t>{256, 72, 105, 10});
  std::ofstream(dir / "bad.txt") << "1 2 x3 4";
  CHECK(has(error_of([&] { read_token_ids(dir / "bad.txt"); }), "bad.txt: entry 2 'x3' is not an integer token id"));
  const std::vector<int64_t> ids = {256, 1, 2, 3};
  write_npy(dir / "ids.npy", TensorToWrite::of_ints("ids", {4}, ids.data(), DType::I32));
  CHECK(read_token_ids(dir / "ids.npy") == ids);
  // A batch of one, as tokenizers return it, is one sequence; other ranks are not.
  write_npy(dir / "batch1.npy", TensorToWrite::of_ints("ids", {1, 4}, ids.data(), DType::I64));
  CHECK(read_token_ids(dir / "batch1.npy") == ids);
  write_npy(dir / "square.npy", TensorToWrite::of_ints("ids", {2, 2}, ids.data(), DType::I32));
  const std::string square = error_of([&] { read_token_ids(dir / "square.npy"); });
  CHECK(has(square, (dir / "square.npy").string()));
  CHECK(has(square, "token ids must be a 1-D array [T] (or [1, T]), got shape [2, 2]"));
  write_npy(dir / "scalar.npy", TensorToWrite::of_ints("ids", {}, ids.data(), DType::I32));
  CHECK(has(error_of([&] { read_token_ids(dir / "scalar.npy"); }), "got shape []"));
  CHECK(has(error_of([&] { read_token_ids(dir); }), dir.string() + ": is a directory, expected a token id file"));
  const std::vector<float> f = {1, 2};
  write_npy(dir / "f.npy", TensorToWrite::of_floats("f", {2}, f.data()));
  CHECK(has(error_of([&] { read_token_ids(dir / "f.npy"); }), "f.npy: token ids must be an integer array, got F32"));
  write_bytes(dir / "b.npy", npy_image("|b1", {3}, Bytes{1, 0, 1}));  // booleans are not ids (as in recordings)
  CHECK(has(error_of([&] { read_token_ids(dir / "b.npy"); }), "b.npy: token ids must be an integer array, got BOOL"));
  CHECK(has(error_of([&] { read_token_ids(dir / "none.txt"); }), "none.txt: cannot open"));
}

TEST_CASE("token id files: a .safetensors file's input_ids") {
  const fs::path dir = scratch_dir("token_files_safetensors");
  const std::vector<int64_t> ids = {256, 257, 49, 258};
  const std::vector<float> logits = {0.5f, -1.0f};
  write_safetensors(dir / "ref.safetensors", {TensorToWrite::of_floats("logits", {2}, logits.data()),
                                              TensorToWrite::of_ints("input_ids", {4}, ids.data(), DType::I32)});
  CHECK(read_token_ids(dir / "ref.safetensors") == ids);
  // The bundled reference files carry the ids Hugging Face ran on.
  const std::vector<int64_t> ref = read_token_ids(data_dir() / "reference" / "reasoning-bytes-reference.safetensors");
  REQUIRE(ref.size() == 977);
  CHECK(ref[0] == 256);
  CHECK(ref[768] == 258);
  write_safetensors(dir / "no_ids.safetensors", {TensorToWrite::of_floats("logits", {2}, logits.data())});
  const std::string none = error_of([&] { read_token_ids(dir / "no_ids.safetensors"); });
  CHECK(has(none, (dir / "no_ids.safetensors").string()));
  CHECK(has(none, "no tensor 'input_ids'"));
  CHECK(has(none, "it has logits"));
  write_safetensors(dir / "float_ids.safetensors", {TensorToWrite::of_floats("input_ids", {2}, logits.data())});
  CHECK(has(error_of([&] { read_token_ids(dir / "float_ids.safetensors"); }), "token ids must be an integer array, got F32"));
}

TEST_CASE("load_tokens: BOS from the model config, max_tokens, tokenizer choice") {
  const fs::path dir = scratch_dir("load_tokens");
  std::ofstream(dir / "t.txt") << "In the beginning";
  ModelConfig cfg;
  cfg.vocab_size = 257;
  cfg.bos_token_id = 256;
  cfg.config_file = dir / "config.json";
  TokenSource src;
  src.text = dir / "t.txt";
  std::vector<int64_t> want = {256};
  for (int64_t b : bytes_of("In the beginning")) want.push_back(b);
  CHECK(load_tokens(src, cfg) == want);
  src.max_tokens = 4;
  CHECK(load_tokens(src, cfg) == std::vector<int64_t>{256, 'I', 'n', ' '});
  src.add_bos = false;
  CHECK(load_tokens(src, cfg) == std::vector<int64_t>{'I', 'n', ' ', 't'});
  // GPT-2 BPE: no BOS unless asked.
  src = TokenSource{};
  src.text = dir / "t.txt";
  src.tokenizer = write_tokenizer(dir, false, false).string();
  const std::vector<int64_t> bpe = load_tokens(src, cfg);
  CHECK(bpe.front() == 'I');
  CHECK(bpe.size() < want.size() - 1);  // " the" merged
  src.add_bos = true;
  CHECK(load_tokens(src, cfg).front() == 256);
  cfg.bos_token_id.reset();
  CHECK(has(error_of([&] { load_tokens(src, cfg); }), "has no bos_token_id"));
  std::ofstream(dir / "one.txt") << "";
  TokenSource one;
  one.text = dir / "one.txt";
  one.add_bos = false;
  CHECK(has(error_of([&] { load_tokens(one, cfg); }), "0 token(s); evaluation needs at least 2"));
  // A directory is not a text file (it would read as empty: "1 token(s)" with a BOS).
  TokenSource folder;
  folder.text = dir;
  CHECK(has(error_of([&] { load_tokens(folder, cfg); }), dir.string() + ": is a directory, expected a text file"));
}

TEST_CASE("load_tokens: only as much text is read as max_tokens needs, with the tokens of the whole text") {
  const fs::path dir = scratch_dir("load_tokens_bounded");
  ModelConfig cfg;
  cfg.vocab_size = 300;
  cfg.bos_token_id = 256;
  cfg.config_file = dir / "config.json";
  // A long text of words, numbers, symbols, space runs and newlines (about 1 MB).
  std::string text;
  const char* words[] = {"the", "world's", "42", "!!", "Hello", "  ", "\n", "x", "caf\xC3\xA9", "\n\n "};
  for (int i = 0; text.size() < (1u << 20); ++i) text += std::string(words[(i * 7) % 10]) + (i % 3 ? " " : "");
  std::ofstream(dir / "long.txt") << text;
  const fs::path tokenizer = write_tokenizer(dir, false, false);
  const auto bpe = BpeTokenizer::load(tokenizer);
  const std::vector<int64_t> whole = bpe->encode(text);
  TokenSource src;
  src.text = dir / "long.txt";
  src.tokenizer = tokenizer.string();
  REQUIRE(whole.size() > 100000);
  for (int64_t n : {2, 7, 1000, 40000, 100000}) {
    CAPTURE(n);
    src.max_tokens = n;
    CHECK(load_tokens(src, cfg) == std::vector<int64_t>(whole.begin(), whole.begin() + n));
  }
  // What lies beyond is never read: a byte the vocabulary lacks ('z' removed) after
  // the first megabyte fails only a read of everything.
  nlohmann::json j = nlohmann::json::parse(std::ifstream(tokenizer));
  j["model"]["vocab"].erase("z");
  std::ofstream(dir / "no_z.json") << j.dump();
  std::ofstream(dir / "long.txt", std::ios::app) << " z";
  src.tokenizer = (dir / "no_z.json").string();
  src.max_tokens = 1000;
  CHECK(load_tokens(src, cfg) == std::vector<int64_t>(whole.begin(), whole.begin() + 1000));
  src.max_tokens = 0;
  CHECK(has(error_of([&] { load_tokens(src, cfg); }), "the vocabulary has no token 'z'"));
  // The byte tokenizer reads max_tokens bytes (one fewer with BOS).
  CHECK(read_file_prefix(dir / "long.txt", "a text", 5) == text.substr(0, 5));
  bool at_end = true;
  CHECK(read_file_prefix(dir / "long.txt", "a text", 5, &at_end).size() == 5);
  CHECK(!at_end);
  std::ofstream(dir / "five.txt") << "12345";
  CHECK(read_file_prefix(dir / "five.txt", "a text", 5, &at_end) == "12345");
  CHECK(at_end);
  CHECK(has(error_of([&] { read_file_prefix(dir / "missing.txt", "a text", 5); }), "missing.txt: cannot open a text"));
}

TEST_CASE("encode_for_model: UTF-8 for a tokenizer.json, BOS never doubled, errors name the text") {
  const fs::path dir = scratch_dir("encode_for_model");
  const auto bpe = BpeTokenizer::load(write_tokenizer(dir, false, false));
  const ByteTokenizer bytes(std::nullopt);
  // Latin-1 "café": the byte tokenizer reads it; a tokenizer.json refuses it, by byte.
  CHECK(encode_for_model(bytes, "caf\xE9", std::nullopt, "t.txt") == bytes_of("caf\xE9"));
  CHECK(has(error_of([&] { encode_for_model(*bpe, "caf\xE9 x", std::nullopt, "t.txt"); }),
            "t.txt: the text is not UTF-8 at byte 3 (0xE9)"));
  CHECK(first_invalid_utf8("caf\xC3\xA9") == std::nullopt);
  CHECK(first_invalid_utf8("ab\xC3") == size_t{2});          // a truncated character
  CHECK(first_invalid_utf8("\xED\xA0\x80") == size_t{0});  // an encoded surrogate
  // A text that begins with the BOS token keeps that one.
  const int64_t eot = id_of(*bpe, "<|endoftext|>");
  const std::vector<int64_t> once = encode_for_model(*bpe, "<|endoftext|>the", eot, "t.txt");
  CHECK(once == std::vector<int64_t>{eot, id_of(*bpe, "t"), id_of(*bpe, "he")});
  CHECK(encode_for_model(*bpe, "the", eot, "t.txt").front() == eot);
  CHECK(encode_for_model(bytes, "ab", 256, "t.txt") == std::vector<int64_t>{256, 'a', 'b'});
  // The tokenizer's own errors get the text's name in front.
  nlohmann::json j = nlohmann::json::parse(std::ifstream(write_tokenizer(dir, false, false)));
  j["model"]["vocab"].erase("z");
  std::ofstream(dir / "no_z.json") << j.dump();
  const auto no_z = BpeTokenizer::load(dir / "no_z.json");
  CHECK(has(error_of([&] { encode_for_model(*no_z, "a z", std::nullopt, "prompt.txt"); }),
            "prompt.txt: " + (dir / "no_z.json").string() + ": the vocabulary has no token 'z'"));
}

TEST_CASE("knows and decode_known: ids beyond the tokenizer's vocabulary are skipped, as tokenizers' decode") {
  const fs::path dir = scratch_dir("decode_known");
  const auto bpe = BpeTokenizer::load(write_tokenizer(dir, false, false));
  const int64_t eot = id_of(*bpe, "<|endoftext|>");
  CHECK(bpe->knows('a'));
  CHECK(bpe->knows(eot));
  CHECK(!bpe->knows(eot + 1));
  CHECK(!bpe->knows(-1));
  CHECK(has(error_of([&] { bpe->decode({'h', eot + 5}); }), "is not in the vocabulary"));
  CHECK(decode_known(*bpe, {'h', eot + 5, 'i'}) == "hi");
  CHECK(ByteTokenizer(std::nullopt).knows(300));
}

TEST_CASE("stable_prefix_length: no cut when an added token begins with a letter") {
  const fs::path dir = scratch_dir("stable_added_letter");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(write_tokenizer(dir, false, false)));
  const auto plain = BpeTokenizer::load(write_tokenizer(dir, false, false));
  CHECK(plain->stable_prefix_length("hi  abc") == 3);
  // "abc" as an added token: the space run before it ends at the token, so "hi " and
  // "hi  abc" split the spaces differently, and no cut before " x" is stable.
  j["added_tokens"].push_back({{"id", 400}, {"content", "abc"}, {"special", false}});
  std::ofstream(dir / "abc.json") << j.dump();
  const auto with_abc = BpeTokenizer::load(dir / "abc.json");
  CHECK(with_abc->stable_prefix_length("hi  abc") == 0);
  CHECK(with_abc->encode("hi  abc") != [&] {
    std::vector<int64_t> v = with_abc->encode("hi ");
    v.push_back(400);
    return v;
  }());
}

TEST_CASE("BPE: added tokens are found in one pass, each token searched again only when passed") {
  // Many occurrences of one added token among others that never occur: the same ids as
  // splitting by hand (the search once took time quadratic in the occurrences).
  const fs::path dir = scratch_dir("bpe_added_many");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(write_tokenizer(dir, false, false)));
  for (int k = 0; k < 64; ++k)
    j["added_tokens"].push_back({{"id", 500 + k}, {"content", "<never" + std::to_string(k) + ">"}, {"special", true}});
  std::ofstream(dir / "many.json") << j.dump();
  const auto tok = BpeTokenizer::load(dir / "many.json");
  const int64_t eot = id_of(*tok, "<|endoftext|>");
  std::string text;
  std::vector<int64_t> want;
  for (int i = 0; i < 2000; ++i) {
    text += "x<|endoftext|>";
    want.push_back('x');
    want.push_back(eot);
  }
  CHECK(tok->encode(text) == want);
}

TEST_CASE("load_tokens: a FIFO or a device as the text or the token ids is refused, not read") {
  const fs::path dir = scratch_dir("load_tokens_fifo");
  REQUIRE(::mkfifo((dir / "pipe.txt").c_str(), 0600) == 0);
  ModelConfig cfg;
  cfg.vocab_size = 257;
  cfg.bos_token_id = 256;
  TokenSource src;
  src.text = dir / "pipe.txt";
  CHECK(has(error_of([&] { load_tokens(src, cfg); }),
            (dir / "pipe.txt").string() + ": is a FIFO (named pipe), not a regular file; a text file must be a regular file"));
  src.text = "/dev/zero";  // would grow without end
  CHECK(has(error_of([&] { load_tokens(src, cfg); }), "/dev/zero: is a character device, not a regular file"));
  src.text.clear();
  src.token_file = dir / "pipe.txt";
  CHECK(has(error_of([&] { load_tokens(src, cfg); }), "pipe.txt: is a FIFO (named pipe), not a regular file; a token id file"));
  CHECK(has(error_of([&] { BpeTokenizer::load(dir / "pipe.txt"); }), "pipe.txt: is a FIFO (named pipe)"));
}

TEST_CASE("load_tokens: token ids outside the vocabulary name the token file and the model") {
  const fs::path dir = scratch_dir("load_tokens_oov");
  std::ofstream(dir / "ids.txt") << "256 72 300 5";
  ModelConfig cfg;
  cfg.vocab_size = 257;
  cfg.dir = dir / "model";
  cfg.config_file = dir / "model" / "config.json";
  TokenSource src;
  src.token_file = dir / "ids.txt";
  const std::string msg = error_of([&] { load_tokens(src, cfg); });
  CHECK(has(msg, (dir / "ids.txt").string() + ": token id 300 at index 2 is outside the vocabulary of " +
                     (dir / "model").string()));
  CHECK(has(msg, "vocab_size 257"));
  std::ofstream(dir / "neg.txt") << "1 -1";
  src.token_file = dir / "neg.txt";
  CHECK(has(error_of([&] { load_tokens(src, cfg); }), "neg.txt: token id -1 at index 1"));
  std::ofstream(dir / "ok.txt") << "256 1 2";
  src.token_file = dir / "ok.txt";
  CHECK(load_tokens(src, cfg) == std::vector<int64_t>{256, 1, 2});
}
