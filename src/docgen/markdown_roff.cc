#include "docgen/markdown_roff.h"

#include <cctype>
#include <cstdio>
#include <utility>
#include <vector>

namespace ctrun::docgen {
namespace {

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
  }
  return lines;
}

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool Blank(std::string_view s) { return s.find_first_not_of(" \t") == std::string_view::npos; }

std::string_view Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

bool IsFence(std::string_view line) { return StartsWith(line, "```"); }

// Characters README.md uses, as groff glyphs that every device has, -Tascii included ("->", "x").
constexpr std::pair<unsigned, const char*> kGlyphs[] = {
    {0x2192, "\\(->"}, {0x2190, "\\(<-"}, {0x2265, "\\(>="}, {0x2264, "\\(<="},
    {0x00D7, "\\(mu"}, {0x2014, "\\(em"}, {0x2013, "\\(en"}, {0x2019, "'"},
};

// Appends one UTF-8 sequence starting at s[i], as a glyph of kGlyphs or else \[uXXXX] (which
// -Tascii may lack: the man page test renders both devices); advances i past it.
void AppendNonAscii(std::string& out, std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  unsigned cp = len == 1 ? c : c & (0xFF >> (len + 1));
  for (size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len - 1;
  for (const auto& [code, glyph] : kGlyphs)
    if (code == cp) {
      out += glyph;
      return;
    }
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\[u%04X]", cp);
  out += buf;
}

// How Escape treats dashes and line breaks.
enum class Style {
  kProse,     // words that start with '-' (option names): \- and never hyphenated (\%)
  kCode,      // every '-' as \-, no word hyphenated
  kLongCode,  // kCode, and a break point after each '/' (paths longer than a line)
  kLiteral,   // every '-' as \- (fenced lines: no filling, nothing to hyphenate)
};

// Literal text for roff: '\' and non-ASCII escaped, dashes as `style` says.
std::string Escape(std::string_view s, Style style) {
  const bool code = style != Style::kProse;
  std::string out;
  bool option_word = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool after_space = i == 0 || s[i - 1] == ' ';
    bool word_start = after_space || s[i - 1] == '(' || s[i - 1] == '"' || s[i - 1] == '/';
    bool starts_option = c == '-' && word_start && !option_word;
    if (c == ' ') option_word = false;
    if (starts_option) option_word = true;
    bool no_hyphenation = style == Style::kProse ? starts_option : style != Style::kLiteral && after_space;
    if (c != ' ' && no_hyphenation) out += "\\%";
    if (c == '\\') {
      out += "\\e";
    } else if (c == '-' && (code || option_word)) {
      out += "\\-";
    } else if (static_cast<unsigned char>(c) >= 0x80) {
      AppendNonAscii(out, s, i);
    } else {
      out += c;
      if (c == '/' && style == Style::kLongCode) out += "\\:";
    }
  }
  return out;
}

// A text line that roff does not take for a request.
std::string TextLine(std::string roff) {
  if (!roff.empty() && (roff[0] == '.' || roff[0] == '\'')) roff.insert(0, "\\&");
  return roff + "\n";
}

// Inline markdown -> roff: `code`, **bold**, [text](target), backslash escapes.
std::string Inline(std::string_view s) {
  std::string out, plain;
  bool bold = false;
  auto flush = [&] {
    out += Escape(plain, Style::kProse);
    plain.clear();
  };
  for (size_t i = 0; i < s.size(); ++i) {
    size_t close;
    if (s[i] == '`' && (close = s.find('`', i + 1)) != std::string_view::npos) {
      flush();
      std::string_view code = s.substr(i + 1, close - i - 1);
      out += "\\fB" + Escape(code, code.size() > 30 ? Style::kLongCode : Style::kCode) + (bold ? "" : "\\fR");
      i = close;
    } else if (StartsWith(s.substr(i), "**")) {
      flush();
      bold = !bold;
      out += bold ? "\\fB" : "\\fR";
      ++i;
    } else if (s[i] == '[' && (close = s.find("](", i)) != std::string_view::npos &&
               s.find(')', close) != std::string_view::npos) {
      flush();
      out += Inline(s.substr(i + 1, close - i - 1));
      i = s.find(')', close);
    } else if (s[i] == '\\' && i + 1 < s.size() && std::ispunct(static_cast<unsigned char>(s[i + 1]))) {
      plain += s[++i];
    } else {
      plain += s[i];
    }
  }
  flush();
  if (bold) out += "\\fR";
  return out;
}

// The cells of a table row "| a | b\|c |" -> {"a", "b|c"}.
std::vector<std::string> Cells(std::string_view row) {
  row = Trim(row);
  if (StartsWith(row, "|")) row.remove_prefix(1);
  if (!row.empty() && row.back() == '|' && (row.size() < 2 || row[row.size() - 2] != '\\')) row.remove_suffix(1);
  std::vector<std::string> cells(1);
  for (size_t i = 0; i < row.size(); ++i) {
    if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
      cells.back() += '|';
      ++i;
    } else if (row[i] == '|') {
      cells.emplace_back();
    } else {
      cells.back() += row[i];
    }
  }
  for (std::string& c : cells) c = std::string(Trim(c));
  return cells;
}

bool IsTableSeparator(std::string_view row) {
  return Trim(row).find_first_not_of("|:- ") == std::string_view::npos;
}

bool StartsBlock(std::string_view line) {
  return StartsWith(line, "- ") || StartsWith(line, "|") || IsFence(line) || StartsWith(line, "#");
}

// Each Emit* consumes the block starting at lines[i] and leaves i on the first line after it.
void EmitFence(const std::vector<std::string_view>& lines, size_t& i, std::string& out) {
  out += ".PP\n.EX\n";
  for (++i; i < lines.size() && !IsFence(lines[i]); ++i) out += TextLine(Escape(lines[i], Style::kLiteral));
  out += ".EE\n";
  ++i;
}

void EmitTable(const std::vector<std::string_view>& lines, size_t& i, std::string& out) {
  size_t row = 0;
  for (; i < lines.size() && StartsWith(Trim(lines[i]), "|"); ++i, ++row) {
    if (row == 0 || IsTableSeparator(lines[i])) continue;  // the header row, the |---| line
    std::vector<std::string> cells = Cells(lines[i]);
    std::string body;
    for (size_t c = 1; c < cells.size(); ++c) body += (c > 1 ? " \\(em " : "") + Inline(cells[c]);
    out += ".TP\n" + TextLine(Inline(cells[0])) + TextLine(body);
  }
}

void EmitItem(const std::vector<std::string_view>& lines, size_t& i, std::string& out) {
  std::string text(lines[i].substr(2));
  for (++i; i < lines.size() && StartsWith(lines[i], "  ") && !Blank(lines[i]); ++i)
    text += " " + std::string(Trim(lines[i]));
  out += ".IP \\(bu 2\n" + TextLine(Inline(text));
}

void EmitParagraph(const std::vector<std::string_view>& lines, size_t& i, std::string& out) {
  std::string text;
  for (; i < lines.size() && !Blank(lines[i]) && (text.empty() || !StartsBlock(lines[i])); ++i)
    text += (text.empty() ? "" : " ") + std::string(Trim(lines[i]));
  out += ".PP\n" + TextLine(Inline(text));
}

}  // namespace

StatusOr<std::string> MarkdownSection(std::string_view markdown, std::string_view title) {
  const std::string heading = "## " + std::string(title);
  std::string body;
  bool inside = false, fenced = false;
  for (std::string_view line : Lines(markdown)) {
    bool heading_line = !fenced && (StartsWith(line, "# ") || StartsWith(line, "## "));
    if (IsFence(line)) fenced = !fenced;
    if (heading_line) {
      if (inside) break;
      inside = Trim(line) == heading;
      continue;
    }
    if (inside) body += std::string(line) + "\n";
  }
  if (!inside) return Status::Error("README has no section '" + heading + "'");
  size_t end = body.find_last_not_of(" \t\n");
  return end == std::string::npos ? std::string() : body.substr(0, end + 1) + "\n";
}

std::string MarkdownToRoff(std::string_view markdown) {
  std::vector<std::string_view> lines = Lines(markdown);
  std::string out;
  size_t i = 0;
  while (i < lines.size()) {
    std::string_view line = lines[i];
    if (Blank(line)) {
      ++i;
    } else if (IsFence(line)) {
      EmitFence(lines, i, out);
    } else if (StartsWith(line, "#")) {
      out += ".SS " + Inline(Trim(line.substr(line.find(' ') + 1))) + "\n";
      ++i;
    } else if (StartsWith(Trim(line), "|")) {
      EmitTable(lines, i, out);
    } else if (StartsWith(line, "- ")) {
      EmitItem(lines, i, out);
    } else {
      EmitParagraph(lines, i, out);
    }
  }
  return out;
}

std::string RoffText(std::string_view text) {
  std::string line = TextLine(Escape(text, Style::kProse));
  line.pop_back();
  return line;
}

}  // namespace ctrun::docgen
