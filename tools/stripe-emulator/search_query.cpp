#include "search_query.hpp"

namespace stripe_emulator {

namespace {

constexpr std::size_t kMaxClauses = 10;  // Stripe's limit

class QueryParser {
 public:
  explicit QueryParser(std::string_view text) : text_(text) {}

  std::optional<std::vector<SearchClause>> parse(std::string& error) {
    std::vector<SearchClause> clauses;
    skip_spaces();
    if (at_end()) return fail(error, "the query is empty");
    while (true) {
      SearchClause clause;
      if (!parse_clause(clause)) return fail(error, problem_);
      clauses.push_back(std::move(clause));
      const bool had_space = skip_spaces();
      if (at_end()) break;
      if (!had_space || !consume("AND") || !skip_spaces()) {
        return fail(error, "expected ' AND ' between clauses (only AND is supported)");
      }
    }
    if (clauses.size() > kMaxClauses) return fail(error, "a query can have at most 10 clauses");
    return clauses;
  }

 private:
  std::optional<std::vector<SearchClause>> fail(std::string& error, const std::string& why) {
    error = "Invalid search query: " + why + " (at position " + std::to_string(pos_) +
            "). Supported: metadata['KEY']:'VALUE' and customer:'cus_...' joined by AND.";
    return std::nullopt;
  }

  bool at_end() const { return pos_ >= text_.size(); }

  bool skip_spaces() {
    const std::size_t start = pos_;
    while (!at_end() && text_[pos_] == ' ') ++pos_;
    return pos_ > start;
  }

  bool consume(std::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  // A string in single or double quotes; a backslash escapes the next character.
  bool parse_quoted(std::string& out) {
    if (at_end() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      problem_ = "expected a quoted string";
      return false;
    }
    const char quote = text_[pos_++];
    while (!at_end()) {
      char c = text_[pos_++];
      if (c == quote) return true;
      if (c == '\\') {
        if (at_end()) break;
        c = text_[pos_++];
      }
      out += c;
    }
    problem_ = "unterminated string";
    return false;
  }

  bool parse_clause(SearchClause& clause) {
    if (consume("metadata[")) {
      clause.field = SearchClause::Field::metadata;
      if (!parse_quoted(clause.metadata_key)) return false;
      if (!consume("]")) {
        problem_ = "expected ']' after the metadata key";
        return false;
      }
    } else if (consume("customer")) {
      clause.field = SearchClause::Field::customer;
    } else {
      problem_ = "unsupported field (only metadata['KEY'] and customer)";
      return false;
    }
    if (!consume(":")) {
      problem_ = "expected ':' (only exact matches are supported)";
      return false;
    }
    return parse_quoted(clause.value);
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  std::string problem_;
};

}  // namespace

std::optional<std::vector<SearchClause>> parse_search_query(std::string_view query,
                                                            std::string& error) {
  return QueryParser(query).parse(error);
}

bool matches_all(const std::vector<SearchClause>& clauses, const StripeObject& object) {
  for (const auto& clause : clauses) {
    if (clause.field == SearchClause::Field::customer) {
      if (object.customer != clause.value) return false;
    } else {
      const auto found = object.metadata.find(clause.metadata_key);
      if (found == object.metadata.end() || found->second != clause.value) return false;
    }
  }
  return true;
}

}  // namespace stripe_emulator
