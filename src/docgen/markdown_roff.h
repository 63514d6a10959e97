// Markdown -> man(7) roff for the man page's sections that README.md owns (exit codes, environment,
// signals): the README stays their one source and the man page is generated from it.
//
// Contract: only the subset README.md uses is understood. Blocks: paragraphs (.PP), "- " lists with
// continuation lines indented by two spaces (.IP \(bu), tables (one .TP per row: the first cell is
// the tag, the other cells the body; the header row is dropped), ``` fences (.EX/.EE), "###"
// headings (.SS). Inline: `code` and **bold** become bold, [text](target) becomes its text, the
// non-ASCII characters README.md uses (→ ≥ × —) become glyphs every groff device has, others
// groff's \[uXXXX]. The output never starts a line with '.' or '\''
// that is not a request, so `groff -ww` has nothing to warn about. Pure functions, no I/O.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace ctrun::docgen {

// The body of the "## <title>" section of `markdown`: the lines after that heading up to the next
// heading of level 1 or 2 (fenced code is not searched for headings). An error names the title
// when there is no such heading.
StatusOr<std::string> MarkdownSection(std::string_view markdown, std::string_view title);

// The roff of a run of markdown blocks (see above); ends in '\n' unless empty.
std::string MarkdownToRoff(std::string_view markdown);

// Plain text for a roff text line: '\' escaped, option-like words ("--nnodes") with \- for their
// dashes and never hyphenated, non-ASCII as above, and \& in front of a leading '.' or '\''.
std::string RoffText(std::string_view text);

}  // namespace ctrun::docgen
