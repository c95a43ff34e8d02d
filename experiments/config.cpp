#include "experiments/config.h"

#include <charconv>
#include <cmath>

#include <fstream>
#include <regex>
#include <sstream>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/input_file.h"

namespace kvb {

std::string toml_type_with_article(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

namespace {

std::string location(const toml::source_region& src, const std::filesystem::path& file) {
  std::ostringstream os;
  os << (src.path ? *src.path : file.string()) << ":" << src.begin.line;
  return os.str();
}

[[noreturn]] void parse_failed(const toml::parse_error& e, const std::string& name) {
  std::ostringstream os;
  const auto& src = e.source();
  os << (src.path ? *src.path : name) << ":" << src.begin.line << ":" << src.begin.column
     << ": TOML syntax error: " << e.description();
  throw ConfigError(os.str());
}

// Splits "strategy[0].format" / "strategy.0.format" into {"strategy", "0", "format"}.
std::vector<std::string> split_dotted(const std::string& path) {
  std::string normalized;
  for (char c : path) {
    if (c == '[') normalized += '.';
    else if (c != ']') normalized += c;
  }
  return split(normalized, '.');
}

bool is_index(const std::string& s) {
  return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
}

// {"strategy", "0", "format"} -> "strategy[0].format" (the form ConfigTable paths use).
std::string canonical_path(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) {
    if (is_index(p)) out += "[" + p + "]";
    else out += (out.empty() ? "" : ".") + p;
  }
  return out;
}

}  // namespace

std::shared_ptr<ConfigDoc> ConfigDoc::load(const std::filesystem::path& file) {
  try {
    require_regular_file(file, "a config");
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
  std::ifstream in(file);
  if (!in) throw ConfigError(file.string() + ": cannot read config file");
  std::stringstream ss;
  ss << in.rdbuf();
  auto doc = parse(ss.str(), file.string());
  doc->file_ = file;
  return doc;
}

std::shared_ptr<ConfigDoc> ConfigDoc::parse(std::string_view text, const std::string& name) {
  auto doc = std::make_shared<ConfigDoc>();
  doc->file_ = name;
  try {
    doc->root_ = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    parse_failed(e, name);
  }
  return doc;
}

void ConfigDoc::apply_override(const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set '" + assignment + "': expected key=value, e.g. --set data.max_tokens=256");
  const std::string key = trim(assignment.substr(0, eq));
  const std::string text = trim(assignment.substr(eq + 1));
  std::vector<std::string> parts = split_dotted(key);
  for (const std::string& p : parts)
    if (p.empty()) throw ConfigError("--set '" + assignment + "': malformed key '" + key + "'");

  // The value: a TOML value if it parses as one ("3", "[2,4]", "true", "\"x\""), else a string.
  toml::table holder;
  try {
    holder = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    // Plain digits that TOML refuses are an integer out of range, not a string
    // ("0123" or "1__2" are refused as integers but are fine strings).
    static const std::regex integer(R"(^[+-]?[1-9][0-9]*$)");
    int64_t parsed = 0;
    const char* digits = text.c_str() + (text[0] == '+' ? 1 : 0);
    if (std::regex_match(text, integer) &&
        std::from_chars(digits, text.c_str() + text.size(), parsed).ec == std::errc::result_out_of_range)
      throw ConfigError("--set " + key + ": " + text + " is outside the 64-bit integer range");
    holder.insert_or_assign("v", text);
  }

  toml::node* cur = &root_;
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked += (walked.empty() ? "" : ".") + parts[i];
    if (toml::table* t = cur->as_table()) {
      toml::node* next = t->get(parts[i]);
      if (!next) {
        t->insert_or_assign(parts[i], toml::table{});
        next = t->get(parts[i]);
      }
      cur = next;
    } else if (toml::array* a = cur->as_array()) {
      if (!is_index(parts[i]) || std::stoul(parts[i]) >= a->size())
        throw ConfigError("--set " + key + ": '" + walked + "' is not an index of an array with " +
                          std::to_string(a->size()) + " entries");
      cur = a->get(std::stoul(parts[i]));
    } else {
      throw ConfigError("--set " + key + ": '" + walked + "' is " + toml_type_with_article(*cur) + ", not a table");
    }
  }
  if (toml::array* a = cur->as_array()) {  // an array element: budgets.queries.0=...
    if (!is_index(parts.back()) || std::stoul(parts.back()) >= a->size())
      throw ConfigError("--set " + key + ": '" + parts.back() + "' is not an index of an array with " +
                        std::to_string(a->size()) + " entries");
    a->replace(a->cbegin() + static_cast<std::ptrdiff_t>(std::stoul(parts.back())), *holder.get("v"));
    overridden_.insert(canonical_path(parts));
    return;
  }
  toml::table* target = cur->as_table();
  if (!target) throw ConfigError("--set " + key + ": parent of '" + parts.back() + "' is not a table");
  target->insert_or_assign(parts.back(), *holder.get("v"));
  overridden_.insert(canonical_path(parts));
}

ConfigTable ConfigDoc::root() {
  return ConfigTable(shared_from_this(), &root_, "");
}

ConfigDoc::Seen& ConfigDoc::seen(const toml::table* t, const std::string& path) {
  for (auto& s : seen_)
    if (s->table == t) return *s;
  seen_.push_back(std::make_unique<Seen>(Seen{t, path, {}}));
  return *seen_.back();
}

std::vector<std::string> ConfigDoc::overrides_under(const std::string& table_path) const {
  std::vector<std::string> under;
  for (const std::string& path : overridden_) {
    const bool inside = path.size() > table_path.size() && path.compare(0, table_path.size(), table_path) == 0 &&
                        (path[table_path.size()] == '.' || path[table_path.size()] == '[');
    if (inside) under.push_back(path);
  }
  return under;
}

std::string ConfigDoc::where(const toml::node* node, const std::string& dotted) const {
  if (overridden_.count(dotted)) return "--set " + dotted;
  if (node && node->source().begin.line > 0) return location(node->source(), file_) + ": " + dotted;
  return file_.string() + ": " + dotted;
}

void ConfigDoc::check_unknown_keys() const {
  std::vector<std::string> problems;
  for (const auto& s : seen_) {
    for (const auto& [k, v] : *s->table) {
      const std::string key(k.str());
      if (s->asked.count(key)) continue;
      std::vector<std::string> known(s->asked.begin(), s->asked.end());
      const std::string dotted = s->path.empty() ? key : s->path + "." + key;
      std::string msg;
      if (overridden_.count(dotted)) msg = "--set " + dotted;
      else msg = location(k.source().begin.line > 0 ? k.source() : v.source(), file_);
      msg += ": unknown key '" + dotted + "'";
      const std::string hint = did_you_mean(key, known);
      if (!hint.empty()) msg += hint;
      else if (!known.empty()) msg += " (known here: " + join(known, ", ") + ")";
      problems.push_back(msg);
    }
  }
  if (!problems.empty()) throw ConfigError(join(problems, "\n"));
}

// ---------------------------------------------------------------------------

ConfigTable::ConfigTable(std::shared_ptr<ConfigDoc> doc, const toml::table* table, std::string path)
    : doc_(std::move(doc)), table_(table), path_(std::move(path)) {
  doc_->seen(table_, path_);
}

std::string ConfigTable::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

void ConfigTable::allow(std::string_view key) const { doc_->seen(table_, path_).asked.insert(std::string(key)); }

bool ConfigTable::has(std::string_view key) const { return table_->get(key) != nullptr; }

const toml::node* ConfigTable::node(std::string_view key) const {
  allow(key);
  return table_->get(key);
}

std::string ConfigTable::where(std::string_view key) const {
  if (!key.empty()) return doc_->where(table_->get(key), key_path(key));
  std::string at = table_->source().begin.line > 0 ? location(table_->source(), doc_->file()) + ": [" + path_ + "]"
                                                   : doc_->file().string() + (path_.empty() ? "" : ": [" + path_ + "]");
  // A message about the whole table may come from a value --set put inside it.
  const std::vector<std::string> overrides = path_.empty() ? std::vector<std::string>() : doc_->overrides_under(path_);
  if (!overrides.empty()) at += " (with --set " + join(overrides, ", --set ") + ")";
  return at;
}

void ConfigTable::fail(std::string_view key, const std::string& message) const {
  throw ConfigError(where(key) + ": " + message);
}

std::optional<std::string> ConfigTable::opt_string(std::string_view key) const {
  const toml::node* n = node(key);
  if (!n) return std::nullopt;
  if (auto v = n->value<std::string>(); v && n->is_string()) return *v;
  fail(key, "expected a string, got " + toml_type_with_article(*n));
}

std::string ConfigTable::string(std::string_view key, const std::string& def) const {
  return opt_string(key).value_or(def);
}

std::string ConfigTable::required_string(std::string_view key) const {
  if (auto v = opt_string(key)) return *v;
  throw ConfigError(where() + ": missing required key '" + key_path(key) + "'");
}

std::optional<int64_t> ConfigTable::opt_int(std::string_view key) const {
  const toml::node* n = node(key);
  if (!n) return std::nullopt;
  if (n->is_integer()) return n->value<int64_t>();
  fail(key, "expected an integer, got " + toml_type_with_article(*n));
}

int64_t ConfigTable::integer(std::string_view key, int64_t def) const { return opt_int(key).value_or(def); }

std::optional<double> ConfigTable::opt_real(std::string_view key) const {
  const toml::node* n = node(key);
  if (!n) return std::nullopt;
  if (n->is_integer() || n->is_floating_point()) {
    const double v = *n->value<double>();
    if (!std::isfinite(v)) fail(key, "expected a finite number, got " + std::string(n->is_floating_point() ? "nan or inf" : "?"));
    return v;
  }
  fail(key, "expected a number, got " + toml_type_with_article(*n));
}

double ConfigTable::real(std::string_view key, double def) const { return opt_real(key).value_or(def); }

bool ConfigTable::boolean(std::string_view key, bool def) const {
  const toml::node* n = node(key);
  if (!n) return def;
  if (n->is_boolean()) return *n->value<bool>();
  fail(key, "expected true or false, got " + toml_type_with_article(*n));
}

std::vector<std::string> ConfigTable::string_list(std::string_view key, const std::vector<std::string>& def) const {
  const toml::node* n = node(key);
  if (!n) return def;
  if (n->is_string()) return {*n->value<std::string>()};
  const toml::array* a = n->as_array();
  if (!a) fail(key, "expected a string or an array of strings, got " + toml_type_with_article(*n));
  std::vector<std::string> out;
  for (const toml::node& e : *a) {
    if (!e.is_string()) fail(key, "expected an array of strings, found " + toml_type_with_article(e));
    out.push_back(*e.value<std::string>());
  }
  return out;
}

std::vector<int64_t> ConfigTable::int_list(std::string_view key) const {
  const toml::node* n = node(key);
  if (!n) return {};
  if (n->is_integer()) return {*n->value<int64_t>()};
  const toml::array* a = n->as_array();
  if (!a) fail(key, "expected an integer or an array of integers, got " + toml_type_with_article(*n));
  std::vector<int64_t> out;
  for (const toml::node& e : *a) {
    if (!e.is_integer()) fail(key, "expected an array of integers, found " + toml_type_with_article(e));
    out.push_back(*e.value<int64_t>());
  }
  return out;
}

std::optional<ConfigTable> ConfigTable::opt_table(std::string_view key) const {
  const toml::node* n = node(key);
  if (!n) return std::nullopt;
  if (const toml::table* t = n->as_table()) return ConfigTable(doc_, t, key_path(key));
  fail(key, "expected a table, got " + toml_type_with_article(*n));
}

std::vector<ConfigTable> ConfigTable::table_array(std::string_view key) const {
  const toml::node* n = node(key);
  std::vector<ConfigTable> out;
  if (!n) return out;
  if (const toml::table* t = n->as_table()) {
    out.emplace_back(doc_, t, key_path(key) + "[0]");
    return out;
  }
  const toml::array* a = n->as_array();
  if (!a) fail(key, "expected [[" + key_path(key) + "]] tables, got " + toml_type_with_article(*n));
  for (size_t i = 0; i < a->size(); ++i) {
    const toml::table* t = a->get(i)->as_table();
    if (!t) fail(key, "entry " + std::to_string(i) + " is " + toml_type_with_article(*a->get(i)) + ", expected a table");
    out.emplace_back(doc_, t, key_path(key) + "[" + std::to_string(i) + "]");
  }
  return out;
}

std::vector<std::string> ConfigTable::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : *table_) out.emplace_back(k.str());
  return out;
}

}  // namespace kvb
