#include "common/expr.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "common/utf8.h"

namespace kforge {

namespace {

enum class Op {
  kConst, kName, kNeg, kNot, kPlus,
  kAdd, kSub, kMul, kDiv, kMod,
  kEq, kNe, kLt, kLe, kGt, kGe, kAnd, kOr,
  kCeilDiv, kMin, kMax,
};

}  // namespace

struct Expr::Node {
  Op op;
  int64_t value = 0;
  std::string name;
  std::vector<std::shared_ptr<const Node>> kids;
};

namespace {

using NodePtr = std::shared_ptr<const Expr::Node>;


NodePtr MakeNode(Op op, std::vector<NodePtr> kids) {
  auto n = std::make_shared<Expr::Node>();
  n->op = op;
  n->kids = std::move(kids);
  return n;
}

// Recursive-descent parser over the raw text; positions are 0-based internally.
class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<NodePtr> ParseAll() {
    if (text_.size() > kMaxLength) {
      return absl::InvalidArgumentError(absl::StrCat("expression longer than ", kMaxLength, " characters"));
    }
    SkipSpace();
    if (pos_ >= text_.size()) return Error("empty expression");
    KF_ASSIGN_OR_RETURN(NodePtr root, ParseOr());
    SkipSpace();
    if (pos_ < text_.size()) return Error(absl::StrCat("unexpected '", Peek(), "'"));
    return root;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("column ", pos_ + 1, ": ", what));
  }
  std::string Peek() const {
    if (pos_ >= text_.size()) return "end of expression";
    const auto c = static_cast<unsigned char>(text_[pos_]);
    if (c < 0x20 || c >= 0x7f) return absl::StrFormat("\\x%02x", c);
    return std::string(1, text_[pos_]);
  }
  void SkipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Accept(absl::string_view tok) {
    SkipSpace();
    if (text_.substr(pos_, tok.size()) != tok) return false;
    // "<" must not swallow the first half of "<=", "!" of "!=", "=" alone is never an operator.
    if (tok.size() == 1 && pos_ + 1 < text_.size() && text_[pos_ + 1] == '=' &&
        (tok == "<" || tok == ">" || tok == "!")) {
      return false;
    }
    pos_ += tok.size();
    return true;
  }

  using Level = absl::StatusOr<NodePtr> (Parser::*)();

  // One left-associative binary level.
  absl::StatusOr<NodePtr> Binary(Level next, std::initializer_list<std::pair<const char*, Op>> ops) {
    KF_ASSIGN_OR_RETURN(NodePtr lhs, (this->*next)());
    while (true) {
      bool matched = false;
      for (const auto& [tok, op] : ops) {
        if (Accept(tok)) {
          KF_ASSIGN_OR_RETURN(NodePtr rhs, (this->*next)());
          lhs = MakeNode(op, {lhs, rhs});
          matched = true;
          break;
        }
      }
      if (!matched) return lhs;
    }
  }

  absl::StatusOr<NodePtr> ParseOr() { return Binary(&Parser::ParseAnd, {{"||", Op::kOr}}); }
  absl::StatusOr<NodePtr> ParseAnd() { return Binary(&Parser::ParseEq, {{"&&", Op::kAnd}}); }
  // C precedence: relational operators bind tighter than equality.
  absl::StatusOr<NodePtr> ParseEq() {
    return Binary(&Parser::ParseRel, {{"==", Op::kEq}, {"!=", Op::kNe}});
  }
  absl::StatusOr<NodePtr> ParseRel() {
    return Binary(&Parser::ParseAdd, {{"<=", Op::kLe}, {">=", Op::kGe}, {"<", Op::kLt}, {">", Op::kGt}});
  }
  absl::StatusOr<NodePtr> ParseAdd() {
    return Binary(&Parser::ParseMul, {{"+", Op::kAdd}, {"-", Op::kSub}});
  }
  absl::StatusOr<NodePtr> ParseMul() {
    return Binary(&Parser::ParseUnary, {{"*", Op::kMul}, {"/", Op::kDiv}, {"%", Op::kMod}});
  }

  absl::StatusOr<NodePtr> ParseUnary() {
    if (++depth_ > kMaxDepth) return Error("expression nested too deeply");
    absl::StatusOr<NodePtr> out;
    if (Accept("-")) {
      KF_ASSIGN_OR_RETURN(NodePtr kid, ParseUnary());
      out = MakeNode(Op::kNeg, {kid});
    } else if (Accept("+")) {
      KF_ASSIGN_OR_RETURN(NodePtr kid, ParseUnary());
      out = MakeNode(Op::kPlus, {kid});
    } else if (Accept("!")) {
      KF_ASSIGN_OR_RETURN(NodePtr kid, ParseUnary());
      out = MakeNode(Op::kNot, {kid});
    } else {
      out = ParsePrimary();
    }
    --depth_;
    return out;
  }

  absl::StatusOr<NodePtr> ParsePrimary() {
    SkipSpace();
    if (pos_ >= text_.size()) return Error("expected a number, name or '(' but found end of expression");
    const char c = text_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      int64_t v = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, text_[pos_] - '0', &v)) {
          return Error("integer literal too large");
        }
        ++pos_;
      }
      if (pos_ < text_.size() && (std::isalpha(static_cast<unsigned char>(text_[pos_])) ||
                                  text_[pos_] == '.' || text_[pos_] == '_')) {
        return Error(absl::StrCat("unexpected '", Peek(), "' after a number (integers only)"));
      }
      auto n = std::make_shared<Expr::Node>();
      n->op = Op::kConst;
      n->value = v;
      return NodePtr(n);
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t start = pos_;
      while (pos_ < text_.size() &&
             (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) {
        ++pos_;
      }
      std::string name(text_.substr(start, pos_ - start));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == '(') {
        return ParseCall(name, start);
      }
      auto n = std::make_shared<Expr::Node>();
      n->op = Op::kName;
      n->name = std::move(name);
      return NodePtr(n);
    }
    if (Accept("(")) {
      KF_ASSIGN_OR_RETURN(NodePtr inner, ParseOr());
      if (!Accept(")")) return Error(absl::StrCat("expected ')' but found '", Peek(), "'"));
      return inner;
    }
    return Error(absl::StrCat("expected a number, name or '(' but found '", Peek(), "'"));
  }

  absl::StatusOr<NodePtr> ParseCall(const std::string& name, size_t name_pos) {
    Op op;
    if (name == "ceil_div") {
      op = Op::kCeilDiv;
    } else if (name == "min") {
      op = Op::kMin;
    } else if (name == "max") {
      op = Op::kMax;
    } else {
      pos_ = name_pos;
      return Error(absl::StrCat("unknown function ", Quoted(name), " (known: ceil_div, min, max)"));
    }
    Accept("(");
    std::vector<NodePtr> args;
    if (!Accept(")")) {
      while (true) {
        KF_ASSIGN_OR_RETURN(NodePtr arg, ParseOr());
        args.push_back(std::move(arg));
        if (Accept(")")) break;
        if (!Accept(",")) return Error(absl::StrCat("expected ',' or ')' but found '", Peek(), "'"));
      }
    }
    if (op == Op::kCeilDiv && args.size() != 2) {
      pos_ = name_pos;
      return Error(absl::StrCat("ceil_div takes 2 arguments, got ", args.size()));
    }
    if (op != Op::kCeilDiv && args.size() < 2) {
      pos_ = name_pos;
      return Error(absl::StrCat(name, " takes at least 2 arguments, got ", args.size()));
    }
    return MakeNode(op, std::move(args));
  }

  static constexpr int kMaxDepth = 200;
  // Bounds the tree depth of long flat chains (1+1+...), which recursion would otherwise overflow.
  static constexpr size_t kMaxLength = 4096;
  absl::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
};

absl::Status Overflow() { return absl::OutOfRangeError("integer overflow"); }

absl::StatusOr<int64_t> Eval(const Expr::Node& n, const Bindings& env) {
  switch (n.op) {
    case Op::kConst:
      return n.value;
    case Op::kName: {
      auto it = env.find(n.name);
      if (it == env.end()) {
        return absl::NotFoundError(absl::StrCat("undefined name ", Quoted(n.name)));
      }
      return it->second;
    }
    default:
      break;
  }
  std::vector<int64_t> v;
  v.reserve(n.kids.size());
  // && and || short-circuit so a guard like "B != 0 && A % B == 0" is safe.
  if (n.op == Op::kAnd || n.op == Op::kOr) {
    KF_ASSIGN_OR_RETURN(int64_t a, Eval(*n.kids[0], env));
    if (n.op == Op::kAnd && a == 0) return 0;
    if (n.op == Op::kOr && a != 0) return 1;
    KF_ASSIGN_OR_RETURN(int64_t b, Eval(*n.kids[1], env));
    return b != 0 ? 1 : 0;
  }
  for (const auto& k : n.kids) {
    KF_ASSIGN_OR_RETURN(int64_t x, Eval(*k, env));
    v.push_back(x);
  }
  int64_t r = 0;
  switch (n.op) {
    case Op::kNeg:
      if (__builtin_sub_overflow(int64_t{0}, v[0], &r)) return Overflow();
      return r;
    case Op::kPlus:
      return v[0];
    case Op::kNot:
      return v[0] == 0 ? 1 : 0;
    case Op::kAdd:
      if (__builtin_add_overflow(v[0], v[1], &r)) return Overflow();
      return r;
    case Op::kSub:
      if (__builtin_sub_overflow(v[0], v[1], &r)) return Overflow();
      return r;
    case Op::kMul:
      if (__builtin_mul_overflow(v[0], v[1], &r)) return Overflow();
      return r;
    case Op::kDiv:
    case Op::kMod:
    case Op::kCeilDiv:
      if (v[1] == 0) return absl::InvalidArgumentError("division by zero");
      if (v[0] == INT64_MIN && v[1] == -1) return Overflow();
      if (n.op == Op::kDiv) return v[0] / v[1];
      if (n.op == Op::kMod) return v[0] % v[1];
      {
        // Round toward +infinity for any signs.
        int64_t q = v[0] / v[1];
        if ((v[0] % v[1] != 0) && ((v[0] < 0) == (v[1] < 0))) ++q;
        return q;
      }
    case Op::kEq: return v[0] == v[1] ? 1 : 0;
    case Op::kNe: return v[0] != v[1] ? 1 : 0;
    case Op::kLt: return v[0] < v[1] ? 1 : 0;
    case Op::kLe: return v[0] <= v[1] ? 1 : 0;
    case Op::kGt: return v[0] > v[1] ? 1 : 0;
    case Op::kGe: return v[0] >= v[1] ? 1 : 0;
    case Op::kMin: {
      int64_t m = v[0];
      for (int64_t x : v) m = std::min(m, x);
      return m;
    }
    case Op::kMax: {
      int64_t m = v[0];
      for (int64_t x : v) m = std::max(m, x);
      return m;
    }
    default:
      break;
  }
  return absl::InternalError("unhandled expression node");
}

void CollectNames(const Expr::Node& n, absl::flat_hash_set<std::string>& out) {
  if (n.op == Op::kName) out.insert(n.name);
  for (const auto& k : n.kids) CollectNames(*k, out);
}

}  // namespace

absl::StatusOr<Expr> Expr::Parse(absl::string_view text) {
  Parser parser(text);
  KF_ASSIGN_OR_RETURN(NodePtr root, parser.ParseAll());
  return Expr(std::string(text), std::move(root));
}

absl::StatusOr<int64_t> Expr::Evaluate(const Bindings& env) const { return Eval(*root_, env); }

absl::flat_hash_set<std::string> Expr::Names() const {
  absl::flat_hash_set<std::string> out;
  CollectNames(*root_, out);
  return out;
}

absl::StatusOr<int64_t> EvaluateExpr(absl::string_view text, const Bindings& env) {
  auto e = Expr::Parse(text);
  if (!e.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(Quoted(text), ": ", e.status().message()));
  }
  auto v = e->Evaluate(env);
  if (!v.ok()) {
    return absl::Status(v.status().code(), absl::StrCat(Quoted(text), ": ", v.status().message()));
  }
  return v;
}

}  // namespace kforge
