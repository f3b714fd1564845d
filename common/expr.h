#pragma once

// Integer expressions for shapes, launch dimensions, kernel arguments and constraints:
// + - * / % (C semantics), parentheses, ceil_div, min, max, comparisons and && || !.
// Parse errors carry the 1-based column of the offending character.

#include "absl/strings/string_view.h"
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"

namespace kforge {

using Bindings = absl::flat_hash_map<std::string, int64_t>;

class Expr {
 public:
  // Parses `text`. On error the status message reads "column C: what is wrong".
  [[nodiscard]] static absl::StatusOr<Expr> Parse(absl::string_view text);

  // Evaluates with the given names bound. Errors: unbound name, division by zero, overflow.
  [[nodiscard]] absl::StatusOr<int64_t> Evaluate(const Bindings& env) const;

  // Every name the expression reads, for checking against what is defined.
  absl::flat_hash_set<std::string> Names() const;

  const std::string& text() const { return text_; }

  struct Node;

 private:
  Expr(std::string text, std::shared_ptr<const Node> root)
      : text_(std::move(text)), root_(std::move(root)) {}

  std::string text_;
  std::shared_ptr<const Node> root_;  // immutable; copies share it
};

// Parses and evaluates in one go; errors mention the expression text.
[[nodiscard]] absl::StatusOr<int64_t> EvaluateExpr(absl::string_view text, const Bindings& env);

}  // namespace kforge
