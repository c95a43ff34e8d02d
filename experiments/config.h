// Config reading with exact error locations.
//
// ConfigDoc owns a parsed TOML document (plus --set overrides). ConfigTable is a view
// of one table that records every key the program asks for; once the experiment is
// built, ConfigDoc::check_unknown_keys() reports every key nobody asked for as
// "file:line: unknown key 'metrcs' (did you mean 'metrics'?)". So a typo in a config
// is always an error, never silently ignored.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

namespace kvb {

class ConfigTable;

class ConfigDoc : public std::enable_shared_from_this<ConfigDoc> {
 public:
  // Parses a file; a TOML syntax error is a ConfigError "file:line:col: ...".
  static std::shared_ptr<ConfigDoc> load(const std::filesystem::path& file);
  static std::shared_ptr<ConfigDoc> parse(std::string_view text, const std::string& name);

  // Applies "dotted.key=value" (also "strategy.0.format=..." or "strategy[0].format");
  // the value is read as a TOML value when it parses as one, else as a string.
  void apply_override(const std::string& assignment);

  ConfigTable root();
  const std::filesystem::path& file() const { return file_; }
  const toml::table& table() const { return root_; }

  // Throws ConfigError listing every key that was never asked for.
  void check_unknown_keys() const;

  // "file:line" of a node, or "--set key" for a value that came from the command line.
  std::string where(const toml::node* node, const std::string& dotted) const;
  // The --set paths inside the (non-root) table at table_path, sorted.
  std::vector<std::string> overrides_under(const std::string& table_path) const;

 private:
  friend class ConfigTable;
  struct Seen {
    const toml::table* table;
    std::string path;            // dotted path of the table ("" = root)
    std::set<std::string> asked;  // keys the program asked for
  };
  Seen& seen(const toml::table* t, const std::string& path);

  std::filesystem::path file_;
  toml::table root_;
  std::set<std::string> overridden_;  // dotted paths set by --set
  std::vector<std::unique_ptr<Seen>> seen_;
};

class ConfigTable {
 public:
  ConfigTable(std::shared_ptr<ConfigDoc> doc, const toml::table* table, std::string path);

  const std::string& path() const { return path_; }  // "" for the root
  std::string key_path(std::string_view key) const;   // "data.path"
  bool has(std::string_view key) const;
  // Marks the key as known even if absent (for keys handled elsewhere).
  void allow(std::string_view key) const;
  // The raw node (nullptr if absent); marks the key as known.
  const toml::node* node(std::string_view key) const;

  std::optional<std::string> opt_string(std::string_view key) const;
  std::string string(std::string_view key, const std::string& def) const;
  std::string required_string(std::string_view key) const;
  std::optional<int64_t> opt_int(std::string_view key) const;
  int64_t integer(std::string_view key, int64_t def) const;
  std::optional<double> opt_real(std::string_view key) const;
  double real(std::string_view key, double def) const;  // integers accepted
  bool boolean(std::string_view key, bool def) const;
  // A string or an array of strings.
  std::vector<std::string> string_list(std::string_view key, const std::vector<std::string>& def) const;
  std::vector<int64_t> int_list(std::string_view key) const;

  std::optional<ConfigTable> opt_table(std::string_view key) const;
  std::vector<ConfigTable> table_array(std::string_view key) const;  // [[key]] or a single [key]
  // Keys present in this table, sorted.
  std::vector<std::string> keys() const;

  // "file:line: key" for messages about this key; "file:line: [table]" for this table
  // when key is empty, followed (below the root) by " (with --set a.b, --set a.c)" for
  // the values that --set put inside it.
  std::string where(std::string_view key = {}) const;
  [[noreturn]] void fail(std::string_view key, const std::string& message) const;

  const std::shared_ptr<ConfigDoc>& doc() const { return doc_; }
  const toml::table& raw() const { return *table_; }

 private:
  std::shared_ptr<ConfigDoc> doc_;
  const toml::table* table_;
  std::string path_;
};

// TOML type of a node with its article, for messages ("a string", "an integer", ...).
std::string toml_type_with_article(const toml::node& n);

}  // namespace kvb
